//! Wrong shapes, dtypes and devices give errors that name them; nothing panics.

use cohort_tensor::{DType, Device, Error, Result, Tensor};

fn msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

fn t(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, &Device::Cpu).expect("zeros")
}

#[test]
fn shape_errors_name_the_shapes() {
    let a = t(&[2, 3], DType::F32);
    let b = t(&[4, 5], DType::F32);
    let m = msg(a.add(&b));
    assert!(
        m.contains("add") && m.contains("[2, 3]") && m.contains("[4, 5]"),
        "{m}"
    );
    let m = msg(a.matmul(&a));
    assert!(m.contains("matmul") && m.contains("[2, 3]"), "{m}");
    let m = msg(t(&[2, 3, 4], DType::F32).matmul(&t(&[5, 4, 2], DType::F32)));
    assert!(m.contains("[2, 3, 4]") && m.contains("[5, 4, 2]"), "{m}");
    let m = msg(a.reshape(&[7]));
    assert!(
        m.contains("reshape") && m.contains("[7]") && m.contains('6'),
        "{m}"
    );
    let m = msg(Tensor::from_vec(vec![1.0f32; 5], &[2, 3], &Device::Cpu));
    assert!(m.contains("[2, 3]") && m.contains('5'), "{m}");
    let m = msg(a.sum(2, false));
    assert!(m.contains("dim 2") && m.contains("rank 2"), "{m}");
    let m = msg(a.narrow(1, 2, 2));
    assert!(m.contains("narrow") && m.contains("size 3"), "{m}");
    let m = msg(Tensor::cat(&[&a, &b], 0));
    assert!(m.contains("cat"), "{m}");
    assert!(Tensor::cat(&[], 0).is_err());
    let m = msg(a.broadcast_to(&[3, 3]));
    assert!(m.contains("broadcast_to") && m.contains("[3, 3]"), "{m}");
    let m = msg(a.sum_to(&[4]));
    assert!(m.contains("sum_to"), "{m}");
    let m = msg(a.assign_(&b));
    assert!(m.contains("assign_") && m.contains("[4, 5]"), "{m}");
    let m = msg(a.add_assign_(&t(&[3, 3], DType::F32)));
    assert!(m.contains("add_assign_"), "{m}");
    let m = msg(t(&[3], DType::F32).transpose());
    assert!(m.contains("transpose") && m.contains("[3]"), "{m}");
    let x = t(&[1, 2, 5, 5], DType::F32);
    let m = msg(x.conv2d(&t(&[4, 3, 3, 3], DType::F32), None, 1, 0, 1));
    assert!(m.contains("conv2d") && m.contains("[4, 3, 3, 3]"), "{m}");
    assert!(
        x.conv2d(&t(&[4, 2, 3, 3], DType::F32), None, 0, 0, 1)
            .is_err()
    );
    assert!(
        x.conv2d(&t(&[4, 2, 7, 7], DType::F32), None, 1, 0, 1)
            .is_err()
    );
    assert!(
        x.conv2d(
            &t(&[4, 2, 3, 3], DType::F32),
            Some(&t(&[3], DType::F32)),
            1,
            0,
            1
        )
        .is_err()
    );
    let m = msg(x.max_pool2d(6, 1));
    assert!(m.contains("max_pool2d"), "{m}");
    assert!(x.max_pool2d(2, 0).is_err());
    let m = msg(t(&[4, 3], DType::F32).gather_last(&t(&[3], DType::I32)));
    assert!(
        m.contains("gather_last") && m.contains("[4, 3]") && m.contains("[3]"),
        "{m}"
    );
    assert!(t(&[2], DType::F32).to_scalar::<f32>().is_err());
}

#[test]
fn dtype_errors_name_the_dtypes() {
    let a = t(&[2, 2], DType::F32);
    let b = t(&[2, 2], DType::F64);
    let m = msg(a.add(&b));
    assert!(
        m.contains("f32") && m.contains("f64") && m.contains("add"),
        "{m}"
    );
    let m = msg(a.matmul(&b));
    assert!(m.contains("f32") && m.contains("f64"), "{m}");
    let m = msg(a.to_vec::<f64>());
    assert!(
        m.contains("to_vec") && m.contains("f32") && m.contains("f64"),
        "{m}"
    );
    let m = msg(t(&[2], DType::F16).exp());
    assert!(m.contains("f16") && m.contains("exp"), "{m}");
    let m = msg(t(&[2, 2], DType::BF16).matmul(&t(&[2, 2], DType::BF16)));
    assert!(m.contains("bf16") && m.contains("matmul"), "{m}");
    let m = msg(t(&[2], DType::I32).relu());
    assert!(m.contains("i32") && m.contains("relu"), "{m}");
    let m = msg(a.index_select(&t(&[1], DType::F32), 0));
    assert!(m.contains("index_select") && m.contains("i32"), "{m}");
    let m = msg(Tensor::one_hot(&t(&[2], DType::U8), 3, DType::F32));
    assert!(m.contains("one_hot") && m.contains("u8"), "{m}");
    let m = msg(Tensor::adam_step_(
        &a,
        &b,
        &a.copy().unwrap(),
        &a.copy().unwrap(),
        &[0.1],
        0.9,
        0.99,
        1e-8,
        0.0,
        false,
        1,
    ));
    assert!(m.contains("f64"), "{m}");
    assert!(
        Tensor::adam_step_(
            &a,
            &a.copy().unwrap(),
            &a.copy().unwrap(),
            &a.copy().unwrap(),
            &[0.1],
            0.9,
            0.99,
            1e-8,
            0.0,
            false,
            0
        )
        .is_err()
    );
    assert!(matches!("f17".parse::<DType>(), Err(Error::ParseDType(_))));
    assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
    assert_eq!(DType::F32.to_string(), "f32");
}

#[test]
fn devices_parse_and_fail_clearly_without_a_gpu() {
    assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
    assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
    assert_eq!(Device::parse("CUDA:3").unwrap(), Device::Cuda(3));
    assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
    let m = msg(Device::parse("tpu"));
    assert!(m.contains("tpu"), "{m}");
    assert!(Device::parse("cuda:x").is_err());
    assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    assert_eq!(Device::Cpu.to_string(), "cpu");
    let best = Device::best();
    assert_eq!(Device::parse("auto").unwrap(), best);
    assert!(Device::Cpu.synchronize().is_ok());
    if best == Device::Cpu {
        // No GPU here: asking for one is an error that names it, never a panic.
        let m = msg(Tensor::zeros(&[2], DType::F32, &Device::Cuda(0)));
        assert!(m.contains("cuda:0"), "{m}");
        let m = msg(t(&[2], DType::F32).to_device(&Device::Cuda(0)));
        assert!(m.contains("cuda:0"), "{m}");
        assert!(Device::Cuda(0).synchronize().is_err());
    }
    let m = msg(cohort_tensor::memory::allocator(&Device::Cpu));
    assert!(m.contains("cpu"), "{m}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_mismatch_names_both_devices() -> Result<()> {
    let a = t(&[2, 2], DType::F32);
    let b = a.to_device(&Device::Cuda(0))?;
    let m = msg(a.add(&b));
    assert!(
        m.contains("cpu") && m.contains("cuda:0") && m.contains("add"),
        "{m}"
    );
    let m = msg(b.matmul(&a));
    assert!(m.contains("cpu") && m.contains("cuda:0"), "{m}");
    let m = msg(a.assign_(&b));
    assert!(m.contains("cpu") && m.contains("cuda:0"), "{m}");
    Ok(())
}

#[test]
fn tenant_scopes_nest_and_restore() {
    use cohort_alloc::TenantId;
    use cohort_tensor::memory::{current_tenant, with_tenant};
    assert_eq!(current_tenant(), TenantId::DEFAULT);
    with_tenant(TenantId(3), || {
        assert_eq!(current_tenant(), TenantId(3));
        with_tenant(TenantId(5), || assert_eq!(current_tenant(), TenantId(5)));
        assert_eq!(current_tenant(), TenantId(3));
    });
    let r = std::panic::catch_unwind(|| with_tenant(TenantId(7), || panic!("inside")));
    assert!(r.is_err());
    assert_eq!(current_tenant(), TenantId::DEFAULT);
}
