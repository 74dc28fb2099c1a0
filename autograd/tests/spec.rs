//! The layer vocabulary: every kind read from TOML and built, the spec's parameter count equal to the built model's,
//! errors that name the key or the layer, and the JSON form checkpoints of cohort 0.1 recorded.

use cohort_autograd::spec::SpecError;
use cohort_autograd::{BuildOptions, ModelSpec, Shape, Tape};
use cohort_tensor::{DType, Device, Tensor};

const DEV: Device = Device::Cpu;

fn spec(layers: &str) -> ModelSpec {
    ModelSpec::from_toml(&format!("layers = [{layers}]")).unwrap_or_else(|e| panic!("{e}"))
}

fn spec_err(layers: &str) -> SpecError {
    ModelSpec::from_toml(&format!("layers = [{layers}]")).unwrap_err()
}

/// Builds `layers` for examples of shape `data` with 1 and 3 members and checks the counts and the output shape.
fn check_counts(name: &str, layers: &str, data: &[usize], x: &Tensor) {
    let s = spec(layers);
    let input = s.input_for(data);
    let want = s.param_count(&input).unwrap();
    assert!(want > 0, "{name}");
    let out = s.shapes(&input).unwrap().pop().unwrap().dims();
    for m in [1, 3] {
        let model = s
            .build(&input, &BuildOptions::new(m, 4, DEV))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(model.member_param_count(), want, "{name}: M = {m}");
        assert_eq!(model.output_shape(), &out[..], "{name}");
        let y = model.forward(&Tape::new(), x).unwrap();
        let mut expect = vec![m, x.shape()[0]];
        expect.extend_from_slice(&out);
        assert_eq!(y.shape(), &expect[..], "{name}: forward");
    }
}

#[test]
fn every_kind_reads_builds_and_counts_its_parameters() {
    let img = Tensor::rand_uniform(&[2, 3 * 8 * 8], 0.0, 1.0, DType::F32, 1, &DEV).unwrap();
    check_counts(
        "resnet",
        r#"{ conv = 8, kernel = 3, padding = "same", bias = false }, { batchnorm = true, act = "relu" },
           { residual = [{ conv = 8, padding = 1 }, { batchnorm = true, momentum = 0.2, act = "relu" }, { conv = 8, padding = 1 }], act = "relu" },
           { residual = [{ conv = 16, stride = 2, padding = 1 }, { batchnorm = true, eps = 1e-3 }], act = "relu" },
           { maxpool = 2, stride = 1 }, { avgpool = 2 }, { global_avgpool = true }, { dropout = 0.1 },
           { linear = 6, act = "sigmoid" }, { act = "gelu" }, { linear = 3, bias = false }"#,
        &[3, 8, 8],
        &img,
    );
    check_counts(
        "image rows as a sequence",
        r#"{ sequence = 8 }, { linear = 16 }, { positional = 10 }, { attention = 4, causal = true },
           { transformer = 2, hidden = 24, dropout = 0.1 }, { layernorm = true, eps = 1e-6 }, { pool = "mean" },
           { linear = 3 }"#,
        &[1, 8, 8],
        &img.narrow(1, 0, 64).unwrap(),
    );
    let ids =
        Tensor::from_vec((0..12).map(|i| i % 7).collect::<Vec<i32>>(), &[2, 6], &DEV).unwrap();
    check_counts(
        "text",
        r#"{ embedding = 8, vocab = 7, padding_id = 0 }, { transformer = 2, causal = true }, { pool = "first" },
           { linear = 2 }"#,
        &[6],
        &ids,
    );
    check_counts(
        "bag",
        r#"{ embedding_bag = 8, vocab = 7 }, { linear = 4, act = "tanh" }, { linear = 2 }"#,
        &[6],
        &ids,
    );
    check_counts(
        "embedding, flattened",
        r#"{ embedding = 3, vocab = 7 }, { flatten = true }, { linear = 2 }"#,
        &[6],
        &ids,
    );
}

#[test]
fn one_default_for_each_option() {
    // A conv's padding defaults to 0 (PyTorch's and the trainer's): 26x26 after a 3x3 kernel on 28x28.
    let s = spec("{ conv = 10, kernel = 3 }");
    assert_eq!(
        s.shapes(&[1, 28, 28]).unwrap()[1],
        Shape::Image {
            channels: 10,
            height: 26,
            width: 26
        }
    );
    assert_eq!(s.param_count(&[1, 28, 28]).unwrap(), 100);
    // The trainer's activations are the layers' own: sigmoid builds.
    spec(r#"{ linear = 4, act = "sigmoid" }"#)
        .build(&[3], &BuildOptions::new(1, 0, DEV))
        .unwrap();
    // A max pool's stride is its own option, defaulting to the window.
    let p = spec("{ maxpool = 3, stride = 2 }, { maxpool = 2 }");
    let shapes = p.shapes(&[1, 9, 9]).unwrap();
    assert_eq!(shapes[1].dims(), [1, 4, 4]);
    assert_eq!(shapes[2].dims(), [1, 2, 2]);
}

#[test]
fn the_json_form_of_the_first_kinds_is_the_one_cohort_0_1_recorded() {
    let s = spec(
        r#"{ linear = 128, act = "relu" }, { conv = 16, kernel = 3 }, { maxpool = 2 }, { flatten = true },
           { dropout = 0.1 }, { act = "tanh" }"#,
    );
    let json = serde_json::to_value(&s.layers).unwrap();
    let want = serde_json::json!([
        { "linear": { "out": 128, "act": "relu" } },
        { "conv": { "out": 16, "kernel": 3, "stride": 1, "padding": 0, "act": null } },
        { "max_pool": { "kernel": 2, "stride": 2 } },
        "flatten",
        { "dropout": { "p": 0.1 } },
        { "act": "tanh" },
    ]);
    assert_eq!(json, want);
}

#[test]
fn errors_name_the_key_or_the_layer() {
    let e = spec_err("{ linear = 8 }, { lstm = 4 }");
    assert_eq!(e.key, "layers[1].lstm");
    assert!(
        e.message.contains("unknown layer kind") && e.message.contains("transformer"),
        "{e}"
    );
    let e = spec_err("{ linear = 8, kernal = 3 }");
    assert_eq!(e.key, "layers[0].kernal");
    assert!(
        e.message.contains("accepted here: act, bias, linear"),
        "{e}"
    );
    let e = spec_err("{ linear = 8, conv = 3 }");
    assert!(e.message.contains("several kinds"), "{e}");
    let e = spec_err(r#"{ residual = [{ conv = 4, padding = "valid" }] }"#);
    assert_eq!(e.key, "layers[0].residual[0].padding");
    let e = spec_err("{ embedding = 4, vocab = 5, padding_id = 5 }");
    assert_eq!(e.key, "layers[0].padding_id");
    let e = spec_err("{ dropout = 1.5 }");
    assert!(e.message.contains("[0, 1)"), "{e}");

    let build = |layers: &str, data: &[usize]| {
        let s = spec(layers);
        s.build(&s.input_for(data), &BuildOptions::new(1, 0, DEV))
            .unwrap_err()
            .to_string()
    };
    let e = build("{ sequence = 4 }, { attention = 3 }", &[16]);
    assert!(
        e.starts_with("layer 1 (attention): 3 heads do not divide the width 4"),
        "{e}"
    );
    let e = build("{ linear = 6 }, { transformer = 2 }", &[16]);
    assert!(
        e.contains("layer 1 (transformer): attention needs a sequence [L, D], got features [6]"),
        "{e}"
    );
    let e = build(
        "{ conv = 4 }, { residual = [{ flatten = true }, { linear = 3 }] }",
        &[1, 6, 6],
    );
    assert!(
        e.starts_with("layer 1 (residual): its layers turn an image [4, 4, 4] into features [3]"),
        "{e}"
    );
    let e = build("{ residual = [{ conv = 4 }, { linear = 3 }] }", &[1, 6, 6]);
    assert!(
        e.contains("its layer 1 (linear): needs flat features"),
        "{e}"
    );
    let e = build("{ sequence = 5 }", &[16]);
    assert!(e.contains("do not split into 5 tokens"), "{e}");
    let e = build("{ sequence = 4 }, { positional = 3 }", &[16]);
    assert!(e.contains("longer than the 3"), "{e}");

    // An id beyond the vocabulary, at run time: the layer and the id.
    let s = spec("{ embedding = 4, vocab = 5 }, { pool = \"mean\" }, { linear = 2 }");
    let model = s.build(&[3], &BuildOptions::new(1, 0, DEV)).unwrap();
    let ids = Tensor::from_vec(vec![1i32, 7, 2], &[1, 3], &DEV).unwrap();
    let e = model.forward(&Tape::new(), &ids).unwrap_err().to_string();
    assert!(
        e.contains("layers.0") && e.contains("token id 7 outside the vocabulary of 5"),
        "{e}"
    );
}
