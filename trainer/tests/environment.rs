//! `COHORT_*` variables are checked on every machine, and the device they or the config name must exist. One test
//! (the variables are the process's): each case sets its variables, runs, and clears them.

use cohort_trainer::cohort::{RunOptions, train};
use cohort_trainer::config::Config;

const VARS: [&str; 5] = [
    "COHORT_DEVICE",
    "COHORT_MEMORY_LIMIT",
    "COHORT_MEMORY_SCOPE",
    "COHORT_MEMORY_GROWTH",
    "COHORT_ALLOCATOR",
];

fn run_with(dir: &std::path::Path, device: &str, vars: &[(&str, &str)]) -> Result<String, String> {
    for v in VARS {
        // SAFETY: this test binary runs one test, on one thread, and nothing else reads the environment meanwhile.
        unsafe { std::env::remove_var(v) };
    }
    for (k, v) in vars {
        // SAFETY: as above.
        unsafe { std::env::set_var(k, v) };
    }
    let text = format!(
        "[run]\nname = \"env\"\ndir = \"{}\"\ndevice = \"{device}\"\nwarmup = false\nsteps = 2\n\
         [data.blobs]\nsource = {{ synthetic = {{ train = 64, test = 16, classes = 2, shape = [4] }} }}\n\
         [[member]]\nname = \"m\"\nmodel = {{ layers = [{{ linear = 2 }}] }}\ndata = \"blobs\"\nbatch = 16\n",
        dir.display()
    );
    let config = Config::parse(&text, "env.toml").map_err(|e| e.to_string())?;
    train(config, RunOptions::default())
        .map(|o| o.summary.map(|s| s.device).unwrap_or_default())
        .map_err(|e| e.to_string())
}

#[test]
fn cohort_variables_are_checked_and_the_device_must_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (var, value) in [
        ("COHORT_MEMORY_LIMIT", "abc"),
        ("COHORT_ALLOCATOR", "foo"),
        ("COHORT_MEMORY_SCOPE", "card"),
        ("COHORT_MEMORY_GROWTH", "maybe"),
        ("COHORT_DEVICE", "tpu"),
    ] {
        let e = run_with(dir, "cpu", &[(var, value)]).unwrap_err();
        assert!(e.contains(var) && e.contains(value), "{var}={value}: {e}");
    }
    // A GPU that does not exist is an error, from the environment or the config, never a silent CPU run.
    let e = run_with(dir, "cpu", &[("COHORT_DEVICE", "cuda:99")]).unwrap_err();
    assert!(e.contains("cuda:99") && e.contains("not available"), "{e}");
    let e = run_with(dir, "cuda:99", &[]).unwrap_err();
    assert!(e.contains("cuda:99"), "{e}");
    // The environment wins over the config; good values train.
    assert_eq!(
        run_with(dir, "cuda:99", &[("COHORT_DEVICE", "cpu")]).unwrap(),
        "cpu"
    );
    assert_eq!(
        run_with(dir, "cpu", &[("COHORT_MEMORY_LIMIT", "40%")]).unwrap(),
        "cpu"
    );
}
