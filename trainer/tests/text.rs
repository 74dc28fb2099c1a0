//! A text data set from a config: `label<TAB>text` files, a vocabulary built on the training file and saved in the
//! run directory and the checkpoints, token models trained on it, and the mismatches refused with the member named.

use std::path::Path;

use cohort_trainer::Error;
use cohort_trainer::checkpoint::CheckpointDir;
use cohort_trainer::cohort::{RunOptions, resume, train};
use cohort_trainer::config::Config;

/// Two classes told apart by their words: "red ..." and "blue ...".
fn write_corpus(dir: &Path) {
    let line = |i: usize| {
        let (label, word) = if i % 2 == 0 { (0, "red") } else { (1, "blue") };
        format!("{label}\tthe {word} thing number {i} is {word}\n")
    };
    std::fs::write(
        dir.join("train.tsv"),
        (0..200).map(line).collect::<String>(),
    )
    .unwrap();
    std::fs::write(
        dir.join("test.tsv"),
        (200..240).map(line).collect::<String>(),
    )
    .unwrap();
}

fn config(dir: &Path, name: &str, model: &str) -> Config {
    let text = format!(
        r#"
[run]
name = "{name}"
dir = "{d}"
device = "cpu"
warmup = false
epochs = 3

[data.words]
source = {{ text = {{ train = "{d}/train.tsv", test = "{d}/test.tsv", max_len = 8, vocab = 300 }} }}
shuffle = 200

[[member]]
name = "reader"
model = {{ layers = [{model}] }}
data = "words"
batch = 16
checkpoint = {{ every = 10 }}
"#,
        d = dir.display()
    );
    Config::parse(&text, &format!("{name}.toml")).unwrap_or_else(|e| panic!("{e}"))
}

const READER: &str = r#"{ embedding = 16, vocab = 300, padding_id = 0 }, { transformer = 2 }, { pool = "mean" }, { linear = 2 }"#;

#[test]
fn a_text_member_learns_and_keeps_its_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    write_corpus(tmp.path());
    let out = train(config(tmp.path(), "text", READER), RunOptions::default()).unwrap();
    let s = out.summary.unwrap();
    let acc = s.members[0].test_accuracy.unwrap();
    assert!(acc > 0.9, "the colour words give the class away: {acc}");
    let vocab = std::fs::read_to_string(out.run_dir.join("vocab-words.json")).unwrap();
    assert!(
        vocab.contains("\"<pad>\"") && vocab.contains("\"blue\""),
        "{vocab}"
    );
    let ck = CheckpointDir::new(out.run_dir.join("reader").join("checkpoints"), 10)
        .unwrap()
        .load_latest()
        .unwrap()
        .unwrap();
    let words = ck.checkpoint.manifest.vocabulary.unwrap().reindexed();
    assert!(words.id("red") > 1, "a known word");
    assert_eq!(words.id("green"), 1, "an unknown word");

    // The training text changes under a run: its vocabulary does, and resume refuses.
    let halted = train(
        config(tmp.path(), "halted", READER),
        RunOptions {
            halt_after_steps: Some(12),
            ..RunOptions::default()
        },
    )
    .unwrap();
    let train_file = tmp.path().join("train.tsv");
    let edited = std::fs::read_to_string(&train_file)
        .unwrap()
        .replace("thing", "object");
    std::fs::write(&train_file, edited).unwrap();
    let e = resume(&halted.run_dir, RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the vocabulary of [data.words]: its training text changed"),
        "{e}"
    );
}

#[test]
fn models_that_do_not_fit_the_text_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    write_corpus(tmp.path());
    let refuse = |model: &str, want: &str| {
        let e = train(config(tmp.path(), "bad", model), RunOptions::default()).unwrap_err();
        assert!(
            matches!(e, Error::Model { ref member, .. } if member == "reader"),
            "{e}"
        );
        assert!(e.to_string().contains(want), "{e}");
    };
    refuse(
        "{ linear = 2 }",
        "[data.words] holds token ids: start the model with { embedding = D, vocab = ",
    );
    refuse(
        "{ embedding = 4, vocab = 10 }, { pool = \"mean\" }, { linear = 2 }",
        "vocab = 10 is smaller than the",
    );
    refuse(
        "{ embedding = 4, vocab = 300 }, { attention = 3 }",
        "layer 1 (attention): 3 heads do not divide the width 4",
    );
    // Labels are names: a test label the training file lacks names the test file, its line and the classes.
    std::fs::write(tmp.path().join("train.tsv"), "0\tfine\nred\tsome words\n").unwrap();
    let e = train(config(tmp.path(), "bad", READER), RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test.tsv") && e.contains("label \"1\" is not one of the 2 known classes"),
        "{e}"
    );
    // A line that is not label<TAB>text names the file and the line.
    std::fs::write(tmp.path().join("train.tsv"), "0\tfine\nno tab at all\n").unwrap();
    let e = train(config(tmp.path(), "bad", READER), RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("train.tsv") && e.contains("line 2"), "{e}");
}

#[test]
fn a_token_model_on_images_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let text = format!(
        "[run]\ndir = \"{}\"\ndevice = \"cpu\"\n[[member]]\nname = \"m\"\nmodel = {{ layers = [{READER}] }}\n",
        tmp.path().display()
    );
    let e = train(
        Config::parse(&text, "m.toml").unwrap(),
        RunOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("member \"m\": layer 0 takes token ids, but [data.mnist] holds float features"),
        "{e}"
    );
}
