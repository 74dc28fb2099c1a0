//! A run's memory as its user sees it: reserved bytes beside live ones in the records, `memory-trace.json` and
//! `memory.png` from them, and `cohort memory RUN` on a run that trains and on one that stopped.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort_trainer::cohort::train;
use cohort_trainer::memory_timeline::Timeline;
use cohort_trainer::plot::memory::{MarkKind, RESERVED_SHADE, layout, marks};
use common::{config, mlp, quiet, records};

const KIB: u64 = 1024;
const MIB: u64 = 1 << 20;

#[test]
fn records_trace_and_plot_hold_live_reserved_limits_and_ooms() {
    let tmp = tempfile::tempdir().unwrap();
    let hog = "[[member]]\nname = \"hog\"\nmodel = { layers = [{ linear = 256, act = \"relu\" }, { linear = 4 }] }\n\
               data = \"blobs\"\nbatch = 64\nmemory = { limit = \"256KiB\" }\noom = { shrink = 0.15, min_batch = 8 }\n";
    let kept = mlp(
        "kept",
        "batch = 32\nmemory = { limit = \"4MiB\", reserve = \"1MiB\" }",
    );
    let c = config(tmp.path(), "mem", "epochs = 2", &format!("{hog}\n{kept}"));
    let out = train(c, quiet()).unwrap();
    let run = &out.run_dir;

    // Every logged record has the interval's high-water mark, the limit and (kept's) the reserve.
    for (name, limit, reserve) in [("hog", 256 * KIB, None), ("kept", 4 * MIB, Some(MIB))] {
        let logged: Vec<_> = records(run, name)
            .into_iter()
            .filter(|r| r.event.is_none())
            .collect();
        assert!(logged.len() > 2, "{name}");
        for r in &logged {
            let peak = r.mem_peak_bytes.expect("a high-water mark");
            assert!(peak >= r.mem_bytes && peak <= limit, "{name}: {r:?}");
            assert_eq!(
                (r.mem_limit_bytes, r.mem_reserve_bytes),
                (Some(limit), reserve),
                "{name}"
            );
        }
    }
    // kept uses less than its reserve: the pool holds the reserve for it.
    let kept = records(run, "kept");
    let last = kept.iter().rev().find(|r| r.event.is_none()).unwrap();
    assert!(last.mem_bytes > 0 && last.mem_bytes < MIB, "{last:?}");
    assert_eq!(last.reserved_bytes(), Some(MIB));

    // memory-trace.json: live, reserved and limit counters per member, hog's OOM as an instant.
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("memory-trace.json")).unwrap())
            .unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let bytes_of = |n: &str| -> Vec<u64> {
        events
            .iter()
            .filter(|e| e["name"] == n && e["ph"] == "C")
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .collect()
    };
    for m in ["hog", "kept"] {
        assert!(!bytes_of(&format!("{m} live")).is_empty(), "{m} live");
    }
    assert!(bytes_of("kept reserved").iter().all(|&b| b == MIB));
    assert!(
        bytes_of("hog reserved")
            .iter()
            .all(|&b| b > 0 && b <= 256 * KIB)
    );
    assert!(bytes_of("hog limit").iter().all(|&b| b == 256 * KIB));
    assert!(bytes_of("kept limit").contains(&(4 * MIB)));
    assert!(events.iter().any(|e| {
        e["ph"] == "i"
            && e["args"]["member"] == "hog"
            && e["name"]
                .as_str()
                .is_some_and(|n| n.contains("out of memory"))
    }));

    // memory.png: both members' live lines, kept's reserved line (lighter), an × at hog's first OOM.
    let f = std::io::BufReader::new(std::fs::File::open(run.join("memory.png")).unwrap());
    let mut reader = png::Decoder::new(f).read_info().unwrap();
    let mut px = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut px).unwrap();
    let w = info.width as usize;
    let at = |(x, y): (i64, i64)| {
        let i = (y as usize * w + x as usize) * 3;
        [px[i], px[i + 1], px[i + 2]]
    };
    let timeline = Timeline::read(run, &[("hog".into(), None), ("kept".into(), None)]).unwrap();
    let l = layout(&timeline);
    let (blue, orange) = ([31, 119, 180], [255, 127, 14]);
    let light =
        orange.map(|v: u8| (f64::from(v) + (255.0 - f64::from(v)) * RESERVED_SHADE).round() as u8);
    let count = |c: [u8; 3]| {
        (l.frame.top..l.frame.bottom)
            .flat_map(|y| (l.frame.left..l.frame.right).map(move |x| (x, y)))
            .filter(|&p| at(p) == c)
            .count()
    };
    assert!(
        count(blue) > 100 && count(orange) > 100,
        "both members' lines"
    );
    assert!(count(light) > 100, "kept's reserved line");
    let oom = marks(&timeline, &l)
        .into_iter()
        .find(|m| m.member == 0 && m.kind == MarkKind::OutOfMemory)
        .expect("hog's OOM");
    assert_eq!(oom.bytes, 256 * KIB, "on the limit it ran into");
    let (x, y) = l.px(oom.time, oom.bytes);
    let arms = [(-2, -2), (2, 2), (-2, 2), (2, -2)];
    assert!(
        arms.iter().all(|(dx, dy)| at((x + dx, y + dy)) == blue),
        "an × at hog's OOM"
    );
}

/// A config that trains two members on the CPU for hours.
fn long_config(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("live.toml");
    let text = format!(
        "[run]\nname = \"live\"\ndir = \"{}\"\ndevice = \"cpu\"\nwarmup = false\nepochs = 100000\n{}\n{}\n{}",
        dir.join("runs").display(),
        common::DATA,
        mlp("wide", "batch = 32\nmemory = { limit = \"8MiB\" }"),
        "[[member]]\nname = \"narrow\"\nmodel = { layers = [{ linear = 8, act = \"relu\" }, { linear = 4 }] }\n\
         data = \"blobs\"\nbatch = 16\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The live column of `member`'s line in `cohort memory`'s table.
fn live_of(table: &str, member: &str) -> String {
    let header = table
        .lines()
        .find(|l| l.starts_with("member "))
        .unwrap_or_else(|| panic!("no table in {table}"));
    let end = header.find(" live").unwrap() + " live".len();
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(member))
        .unwrap_or_else(|| panic!("no line of {member} in {table}"));
    row[end - 11..end].trim().to_string()
}

#[test]
fn cohort_memory_shows_a_live_run_then_says_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = long_config(tmp.path());
    // A bundle carried to a GPU machine says where its binary is; cargo's path is of the build machine.
    let bin = std::env::var("CARGO_BIN_EXE_cohort").unwrap_or(env!("CARGO_BIN_EXE_cohort").into());
    let child = Command::new(&bin)
        .args(["train", cfg.to_str().unwrap(), "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = tmp.path().join("runs").join("live");
    // The snapshot, once both members have stepped.
    let t0 = Instant::now();
    loop {
        let snapshot: Option<serde_json::Value> = std::fs::read(run.join("memory-now.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let stepped = snapshot.is_some_and(|s| {
            s["members"].as_array().is_some_and(|m| {
                m.len() == 2 && m.iter().all(|m| m["live_bytes"].as_u64() > Some(0))
            })
        });
        if stepped {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no snapshot within a minute"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let memory = || {
        let o = Command::new(&bin)
            .args(["memory", run.to_str().unwrap()])
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{text}");
        text
    };
    let live = memory();
    assert!(
        live.contains(&format!("running (process {})", child.id()))
            && !live.contains("not running"),
        "{live}"
    );
    assert!(live.contains("measured") && live.contains("ago"), "{live}");
    for m in ["wide", "narrow"] {
        let bytes = live_of(&live, m);
        assert!(
            !bytes.is_empty() && bytes != "0 B",
            "{m}: live {bytes:?} in\n{live}"
        );
    }
    assert!(live.contains("8.0 MiB"), "wide's limit: {live}");

    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let after = memory();
    assert!(after.contains("not running"), "{after}");
    for m in ["wide", "narrow"] {
        assert_ne!(live_of(&after, m), "0 B", "{m}'s last record in\n{after}");
    }
    // With a run, `cohort memory` shows no device of its own.
    assert!(
        !after.contains("device:") && !after.contains("allocator:"),
        "{after}"
    );
}
