//! Tape behaviour: accumulation, no-grad scopes, reuse, errors; model specs and member slices.

use cohort_autograd::{BuildOptions, Error, ModelSpec, Param, Tape, Var, loss};
use cohort_tensor::{DType, Device, Tensor};

const DEV: Device = Device::Cpu;

fn t(v: &[f64], s: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), s, &DEV).unwrap()
}

#[test]
fn gradients_accumulate_until_cleared() {
    let p = Param::new("w", t(&[1.0, 2.0], &[2]));
    let x = t(&[3.0, 4.0], &[2]);
    let tape = Tape::new();
    for round in 1..=2 {
        let l = tape
            .param(&p)
            .mul(&Var::constant(x.clone()))
            .unwrap()
            .sum_all()
            .unwrap();
        let g = tape.backward(&l).unwrap();
        assert_eq!(
            g.param(&p).unwrap().to_vec::<f64>().unwrap(),
            vec![3.0, 4.0]
        );
        let want: Vec<f64> = [3.0, 4.0].iter().map(|v| v * round as f64).collect();
        assert_eq!(p.grad().unwrap().to_vec::<f64>().unwrap(), want);
        assert!(tape.is_empty(), "backward clears the recording");
    }
    p.zero_grad();
    assert!(p.grad().is_none());
}

#[test]
fn a_value_used_twice_gets_both_contributions() {
    let tape = Tape::new();
    let x = tape.watch(t(&[2.0], &[1]));
    let y = x.mul(&x).unwrap().add(&x).unwrap(); // x^2 + x: dy/dx = 2x + 1 = 5
    let g = tape.backward(&y).unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f64>().unwrap(), vec![5.0]);
}

#[test]
fn no_grad_records_nothing() {
    let p = Param::new("w", t(&[1.0], &[1]));
    let tape = Tape::new();
    let y = tape.no_grad(|| tape.param(&p).mul_scalar(2.0).unwrap());
    assert!(!y.requires_grad());
    assert!(tape.is_empty());
    assert!(tape.is_recording());
    assert!(matches!(tape.backward(&y), Err(Error::TapeMismatch(_))));
}

#[test]
fn stale_and_foreign_vars_are_errors() {
    let a = Tape::new();
    let b = Tape::new();
    let x = a.watch(t(&[1.0], &[1]));
    let y = b.watch(t(&[1.0], &[1]));
    assert!(matches!(x.add(&y), Err(Error::TapeMismatch("add"))));
    let l = x.mul_scalar(3.0).unwrap();
    a.backward(&l).unwrap();
    assert!(
        matches!(x.add_scalar(1.0), Err(Error::TapeMismatch("add_scalar"))),
        "x belongs to a finished recording"
    );
    assert!(
        matches!(a.backward(&l), Err(Error::TapeMismatch(_))),
        "a differentiated recording cannot be reused"
    );
}

#[test]
fn spec_from_toml_builds_named_parameters() {
    let spec =
        ModelSpec::from_toml(r#"layers = [{ linear = 128, act = "relu" }, { linear = 10 }]"#)
            .unwrap();
    let model = spec.build(&[784], &BuildOptions::new(4, 0, DEV)).unwrap();
    let names: Vec<String> = model.params().iter().map(Param::name).collect();
    assert_eq!(
        names,
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.2.weight",
            "layers.2.bias"
        ]
    );
    assert_eq!(model.params()[0].shape(), &[4, 784, 128]);
    assert_eq!(model.member_param_count(), 784 * 128 + 128 + 128 * 10 + 10);
    // member slices out and in
    let s1 = model.member_state(1).unwrap();
    assert_eq!(s1[0].1.shape(), &[784, 128]);
    model.load_member(3, &s1).unwrap();
    assert_eq!(
        model.member_state(3).unwrap()[0].1.to_vec::<f32>().unwrap(),
        s1[0].1.to_vec::<f32>().unwrap()
    );
    let err = model
        .load_member(0, &[("layers.9.weight".into(), s1[0].1.clone())])
        .unwrap_err();
    assert!(err.to_string().contains("layers.9.weight"), "{err}");
    // whole states load into another model, cast from f64 as read from elsewhere
    let other = spec.build(&[784], &BuildOptions::new(4, 9, DEV)).unwrap();
    let state: Vec<(String, Tensor)> = model
        .state()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(DType::F64).unwrap()))
        .collect();
    other.load_state(&state).unwrap();
    assert_eq!(
        other.params()[2].value().to_vec::<f32>().unwrap(),
        model.params()[2].value().to_vec::<f32>().unwrap()
    );
    assert!(
        other
            .load_state(&state[1..])
            .unwrap_err()
            .to_string()
            .contains("layers.0.weight")
    );
}

#[test]
fn bad_specs_name_the_layer() {
    // Written wrong: the reader names the key.
    let read = [
        (
            r#"layers = [{ linear = 8 }, { lstm = 4 }]"#,
            "layers[1].lstm",
            "unknown layer kind",
        ),
        (
            r#"layers = [{ linear = 4, act = "swish" }]"#,
            "layers[0].act",
            "expected \"relu\"",
        ),
        (
            r#"layers = [{ linear = 4, conv = 3 }]"#,
            "layers[0]",
            "several kinds",
        ),
        (
            r#"layers = [{ linear = 4, colour = "red" }]"#,
            "layers[0].colour",
            "unknown key",
        ),
        (
            r#"layers = [{ dropout = 1.5 }]"#,
            "layers[0].dropout",
            "a rate in [0, 1)",
        ),
    ];
    for (toml, key, want) in read {
        let e = ModelSpec::from_toml(toml).unwrap_err();
        assert_eq!(e.key, key, "{toml}");
        assert!(
            e.message.contains(want),
            "{toml}: got `{e}`, want `{want}..`"
        );
    }
    // Written right but not fitting the input: the builder names the layer.
    let build = [
        (
            r#"layers = [{ conv = 4 }, { linear = 2 }]"#,
            &[1, 6, 6][..],
            "layer 1 (linear): needs flat features",
        ),
        (
            r#"layers = [{ linear = 4 }, { conv = 2 }]"#,
            &[8][..],
            "layer 1 (conv): needs an image [C, H, W]",
        ),
        (
            r#"layers = [{ conv = 4, kernel = 9, padding = 0 }]"#,
            &[1, 6, 6][..],
            "layer 0 (conv): a 9x9 kernel",
        ),
        (
            r#"layers = [{ linear = 4 }, { embedding = 3, vocab = 9 }]"#,
            &[8][..],
            "layer 1 (embedding): needs i32 token ids",
        ),
        (
            r#"layers = [{ conv = 4 }, { maxpool = 8 }]"#,
            &[1, 6, 6][..],
            "layer 1 (maxpool)",
        ),
    ];
    for (toml, input, want) in build {
        let spec = ModelSpec::from_toml(toml).unwrap();
        let err = spec
            .build(input, &BuildOptions::new(2, 0, DEV))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(want),
            "{toml}: got `{err}`, want `{want}..`"
        );
    }
}

#[test]
fn wrong_batches_and_labels_are_errors() {
    let spec = ModelSpec::from_toml(r#"layers = [{ linear = 3 }]"#).unwrap();
    let model = spec.build(&[4], &BuildOptions::new(2, 0, DEV)).unwrap();
    let tape = Tape::new();
    let x = Tensor::zeros(&[5, 3], DType::F32, &DEV).unwrap();
    assert!(
        model
            .forward(&tape, &x)
            .unwrap_err()
            .to_string()
            .contains("[5, 3]")
    );
    let x = Tensor::zeros(&[5, 4], DType::F32, &DEV).unwrap();
    let out = model.forward(&tape, &x).unwrap();
    assert_eq!(out.shape(), &[2, 5, 3]);
    let y = Tensor::from_vec(vec![0i32; 4], &[4], &DEV).unwrap();
    assert!(loss::cross_entropy(&out, &y).is_err());
    let xs = Tensor::zeros(&[2, 5, 4], DType::F32, &DEV).unwrap();
    assert_eq!(
        model.forward_members(&tape, &xs).unwrap().shape(),
        &[2, 5, 3]
    );
}

#[test]
fn accuracy_per_member() {
    let logits = Tensor::from_vec(
        vec![1.0f32, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
        &[2, 2, 2],
        &DEV,
    )
    .unwrap();
    let y = Tensor::from_vec(vec![0i32, 1], &[2], &DEV).unwrap();
    assert_eq!(loss::accuracy(&logits, &y).unwrap(), vec![1.0, 0.5]);
}

#[test]
fn casts_carry_the_gradient_back() {
    let tape = Tape::new();
    let x = tape.watch(t(&[1.5, -2.0], &[2]));
    let y = x
        .to_dtype(DType::F32)
        .unwrap()
        .square()
        .unwrap()
        .sum_all()
        .unwrap();
    assert_eq!(y.dtype(), DType::F32);
    let g = tape.backward(&y).unwrap();
    let gx = g.get(&x).unwrap();
    assert_eq!(gx.dtype(), DType::F64);
    assert_eq!(gx.to_vec::<f64>().unwrap(), vec![3.0, -4.0]);
}
