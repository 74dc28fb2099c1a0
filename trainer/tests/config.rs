//! Config parsing: grid expansion, errors that name the file, the key and what is accepted, and the refusal of two
//! members sharing a directory.

use cohort_autograd::BuildOptions;
use cohort_optim::OptimConfig;
use cohort_tensor::Device;
use cohort_trainer::Error;
use cohort_trainer::config::{Config, ScheduleKind};
use cohort_trainer::run_dir::RunDir;

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, "grid.toml").map_err(|e| e.to_string())
}

const MEMBER: &str = r#"
[[member]]
name = "mlp"
model = { layers = [{ linear = 32, act = "relu" }, { linear = 10 }] }
"#;

#[test]
fn a_list_expands_into_one_member_per_value() {
    let c = parse(&format!(
        "{MEMBER}optimizer = {{ adam = {{ lr = [1e-3, 3e-3, 1e-2] }} }}\n"
    ))
    .unwrap();
    let names: Vec<&str> = c.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["mlp-lr1e-3", "mlp-lr3e-3", "mlp-lr0.01"]);
    let lrs: Vec<f64> = c.members.iter().map(|m| m.optimizer.lr()).collect();
    assert_eq!(lrs, [1e-3, 3e-3, 1e-2]);
    assert_eq!(
        c.members[0].grid,
        vec![("lr".to_string(), "1e-3".to_string())]
    );
}

#[test]
fn several_lists_expand_into_their_product() {
    let c = parse(&format!(
        "{MEMBER}optimizer = {{ sgd = {{ lr = [0.1, 0.05], momentum = 0.9 }} }}\nbatch = [32, 64, 128]\n"
    ))
    .unwrap();
    assert_eq!(c.members.len(), 6);
    let names: Vec<&str> = c.members.iter().map(|m| m.name.as_str()).collect();
    assert!(names.contains(&"mlp-batch32-lr0.1"), "{names:?}");
    assert!(names.contains(&"mlp-batch128-lr0.05"), "{names:?}");
    for m in &c.members {
        assert!(matches!(m.optimizer, OptimConfig::Sgd { momentum, .. } if momentum == 0.9));
    }
    let mut pairs: Vec<(usize, String)> = c
        .members
        .iter()
        .map(|m| (m.batch, format!("{}", m.optimizer.lr())))
        .collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), 6, "every combination once");
}

#[test]
fn a_list_inside_a_layer_expands_too() {
    let c = parse(
        r#"
[[member]]
name = "mlp"
model = { layers = [{ linear = [64, 128], act = "relu" }, { linear = 10 }] }
"#,
    )
    .unwrap();
    let names: Vec<&str> = c.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["mlp-linear64", "mlp-linear128"]);
}

#[test]
fn the_default_job_and_every_example_parse() {
    let d = Config::default_job().unwrap();
    assert!(d.members.len() >= 3);
    assert!(d.members.iter().any(|m| m.name == "cnn"));
    let dir =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            Config::from_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            n += 1;
        }
    }
    assert!(n >= 3, "examples/ holds {n} configs");
}

#[test]
fn a_wrong_type_names_the_file_the_member_and_the_key() {
    let e = parse(&format!(
        "{MEMBER}optimizer = {{ adam = {{ lr = \"fast\" }} }}\n"
    ))
    .unwrap_err();
    assert_eq!(
        e,
        "grid.toml: [[member]] 1, key \"optimizer.adam.lr\": expected a number or a list of numbers, found \"fast\""
    );
}

#[test]
fn unknown_keys_list_what_is_accepted() {
    let e = parse(&format!("{MEMBER}batchsize = 32\n")).unwrap_err();
    assert!(
        e.starts_with("grid.toml: [[member]] 1, key \"batchsize\": unknown key; accepted here:"),
        "{e}"
    );
    assert!(e.contains("batch,"), "{e}");
    let e = parse(&format!("[run]\nschedule = \"round-robin\"\n{MEMBER}")).unwrap_err();
    assert!(
        e.contains("[run], key \"schedule\"") && e.contains("\"epoch-sliced\""),
        "{e}"
    );
    let e = parse(&format!("[run]\nepochs = 0\n{MEMBER}")).unwrap_err();
    assert!(e.contains("key \"epochs\": expected an integer ≥ 1"), "{e}");
    let e = parse(&format!("{MEMBER}memory = {{ limit = \"lots\" }}\n")).unwrap_err();
    assert!(
        e.contains("key \"memory.limit\"") && e.contains("\"2GiB\""),
        "{e}"
    );
    let e = parse(&format!(
        "{MEMBER}model = {{ layers = [{{ linear = 10, act = \"swish\" }}] }}\n"
    ));
    assert!(e.is_err());
}

#[test]
fn a_bad_layer_and_missing_data_say_what_is_accepted() {
    let e = parse("[[member]]\nname = \"m\"\nmodel = { layers = [{ lstm = 10 }] }\n").unwrap_err();
    assert!(
        e.contains("key \"model.layers[0].lstm\": unknown layer kind")
            && e.contains("linear, conv, maxpool"),
        "{e}"
    );
    let e = parse(&format!("{MEMBER}data = \"cifar\"\n")).unwrap_err();
    assert!(e.contains("key \"data\": no [data.cifar] table"), "{e}");
    let e = parse("[run]\nepochs = 3\n").unwrap_err();
    assert!(e.contains("no [[member]] table"), "{e}");
}

#[test]
fn a_syntax_error_names_the_file() {
    let e = parse("[run\nepochs = 3\n").unwrap_err();
    assert!(e.starts_with("grid.toml: not valid TOML"), "{e}");
}

#[test]
fn schedules_parse() {
    for (s, k, fuse) in [
        ("lockstep", ScheduleKind::Lockstep, false),
        ("epoch-sliced", ScheduleKind::EpochSliced, false),
        ("weighted", ScheduleKind::Weighted, false),
        ("fused", ScheduleKind::Lockstep, true),
    ] {
        let c = parse(&format!(
            "[run]\nschedule = \"{s}\"\nfuse = false\n{MEMBER}"
        ))
        .unwrap();
        assert_eq!(c.run.schedule, k);
        assert_eq!(c.run.fuse, fuse);
    }
}

#[test]
fn cuda_graphs_default_on_and_take_a_boolean() {
    assert!(parse(MEMBER).unwrap().run.cuda_graphs);
    let off = parse(&format!("[run]\ncuda_graphs = false\n{MEMBER}")).unwrap();
    assert!(!off.run.cuda_graphs);
    let e = parse(&format!("[run]\ncuda_graphs = \"yes\"\n{MEMBER}")).unwrap_err();
    assert!(
        e.contains("cuda_graphs") && e.contains("true or false"),
        "{e}"
    );
}

#[test]
fn two_members_with_one_directory_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "[run]\ndir = \"{}\"\nname = \"grid\"\n{MEMBER}optimizer = {{ adam = {{ lr = [1e-3, 3e-3] }} }}\n\
         [[member]]\nname = \"mlp-lr1e-3\"\nmodel = {{ layers = [{{ linear = 10 }}] }}\n",
        tmp.path().display()
    );
    let c = Config::parse(&text, "grid.toml").unwrap();
    let err = RunDir::create(&c).unwrap_err();
    assert!(matches!(err, Error::SharedDirectory { .. }));
    let msg = err.to_string();
    assert!(
        msg.starts_with("members \"mlp-lr1e-3\" and \"mlp-lr1e-3\" would write checkpoints to the same directory"),
        "{msg}"
    );
    assert!(msg.contains("give each member its own name"), "{msg}");
    // Names equal but for case collide on case-insensitive file systems: refused as well.
    let text = text.replace("name = \"mlp-lr1e-3\"", "name = \"MLP-lr1e-3\"");
    let c = Config::parse(&text, "grid.toml").unwrap();
    assert!(matches!(
        RunDir::create(&c),
        Err(Error::SharedDirectory { .. })
    ));
}

#[test]
fn every_layer_kind_reads_from_a_config_and_counts_its_parameters() {
    let c = parse(
        r#"
[[member]]
name = "img"
model = { layers = [
  { conv = 8, kernel = 3, padding = "same", bias = false }, { batchnorm = true, momentum = 0.05, act = "relu" },
  { residual = [{ conv = 8, padding = 1 }, { batchnorm = true }, { act = "gelu" }], act = "relu" },
  { residual = [{ conv = 16, stride = 2, padding = 1 }], act = "relu" },
  { maxpool = 2, stride = 1 }, { avgpool = 2 }, { dropout = 0.1 }, { global_avgpool = true },
  { linear = 12, act = "sigmoid" }, { layernorm = true }, { linear = 10, bias = false },
] }

[[member]]
name = "rows"
model = { layers = [
  { sequence = 28 }, { linear = 32 }, { positional = 28 }, { attention = 4, causal = true },
  { transformer = 2, hidden = 64, dropout = 0.1 }, { pool = "first" }, { linear = 10 },
] }
"#,
    )
    .unwrap();
    for m in &c.members {
        let spec = m.model.spec().unwrap();
        let input = spec.input_for(&[1, 28, 28]);
        let want = spec.param_count(&input).unwrap();
        let model = spec
            .build(&input, &BuildOptions::new(2, 0, Device::Cpu))
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        assert_eq!(model.member_param_count(), want, "{}", m.name);
        assert_eq!(model.output_shape(), &[10], "{}", m.name);
    }
    // Conv 8·9 + BN 16 + residual (8·8·9 + 8 + 16) + residual (16·8·9 + 16 + projection 16·8 + 16)
    // + linear 16·12 + 12 + layernorm 24 + linear 12·10.
    assert_eq!(
        c.members[0]
            .model
            .spec()
            .unwrap()
            .param_count(&[1, 28, 28])
            .unwrap(),
        72 + 16 + 600 + 1312 + 204 + 24 + 120
    );
}

#[test]
fn precision_defaults_to_fp32_is_set_run_wide_and_overridden_per_member() {
    use cohort_tensor::Precision;
    let plain = parse(MEMBER).unwrap();
    assert_eq!(plain.run.precision, Precision::Fp32);
    assert_eq!(plain.members[0].precision, Precision::Fp32);
    assert!(
        !plain.members[0].hyperparameters.contains_key("precision"),
        "an all-fp32 run records no precision"
    );
    for p in Precision::ALL {
        let c = parse(&format!("{MEMBER}precision = \"{p}\"\n")).unwrap();
        assert_eq!(c.members[0].precision, p, "{p}");
    }
    let c = parse(&format!(
        "[run]\nprecision = \"bf16\"\n{MEMBER}\n[[member]]\nname = \"half\"\n\
         model = {{ layers = [{{ linear = 10 }}] }}\nprecision = \"f16\"\n"
    ))
    .unwrap();
    assert_eq!(c.run.precision, Precision::Bf16);
    let got: Vec<(&str, Precision)> = c
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.precision))
        .collect();
    assert_eq!(got, [("mlp", Precision::Bf16), ("half", Precision::F16)]);
    // Reports group by it: every member of a run with a policy other than fp32 records its own.
    assert_eq!(c.members[0].hyperparameters["precision"], "bf16");
    assert_eq!(c.members[1].hyperparameters["precision"], "f16");
}

#[test]
fn a_bad_precision_names_the_key_the_member_and_what_is_accepted() {
    let e = Config::parse(&format!("{MEMBER}precision = \"fp16\"\n"), "grid.toml").unwrap_err();
    assert_eq!(
        (e.section.as_str(), e.key.as_str()),
        ("[[member]] 1", "precision")
    );
    assert!(e.message.starts_with("member \"mlp\": "), "{e}");
    // The tensor crate's message: the value, and every accepted one.
    for s in ["\"fp16\"", "\"fp32\"", "\"tf32\"", "\"bf16\"", "\"f16\""] {
        assert!(e.message.contains(s), "{s} in {e}");
    }
    let e = Config::parse(
        &format!("[run]\nprecision = \"half\"\n{MEMBER}"),
        "grid.toml",
    )
    .unwrap_err();
    assert_eq!((e.section.as_str(), e.key.as_str()), ("[run]", "precision"));
    assert!(
        e.message.contains("\"half\"") && e.message.contains("\"bf16\""),
        "{e}"
    );
    let e = Config::parse(&format!("[run]\nprecision = 16\n{MEMBER}"), "grid.toml").unwrap_err();
    assert_eq!(e.key, "precision");
    assert!(e.message.contains("\"tf32\""), "{e}");
}

#[test]
fn a_grid_over_precisions_gives_a_member_per_policy_named_as_grids_name_strings() {
    use cohort_tensor::Precision;
    let c = parse(&format!("{MEMBER}precision = [\"fp32\", \"bf16\"]\n")).unwrap();
    let got: Vec<(&str, Precision)> = c
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.precision))
        .collect();
    assert_eq!(
        got,
        [
            ("mlp-precision_fp32", Precision::Fp32),
            ("mlp-precision_bf16", Precision::Bf16)
        ]
    );
    assert_eq!(c.members[1].hyperparameters["precision"], "bf16");
    assert_eq!(c.members[0].hyperparameters["precision"], "fp32");
    // A bad value inside a grid is refused like a single one.
    let e = parse(&format!("{MEMBER}precision = [\"fp32\", \"int8\"]\n")).unwrap_err();
    assert!(
        e.contains("key \"precision\"") && e.contains("\"int8\""),
        "{e}"
    );
}
