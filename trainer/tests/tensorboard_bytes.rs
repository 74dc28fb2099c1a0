//! TensorBoard event files against the published TFRecord format (tensorflow/core/lib/io/record_writer.cc,
//! tensorflow/core/lib/hash/crc32c.h) and the Event/Summary protobuf wire format.

use cohort_trainer::tensorboard::{
    EventWriter, file_version_event, masked_crc32c, record, scalars_event, session_start_event,
};

/// The mask as the TFRecord documentation states it, written independently of the crate's code.
#[allow(clippy::manual_rotate)] // spelled as the format documents it
fn mask(crc: u32) -> u32 {
    ((crc >> 15) | (crc << 17)).wrapping_add(0xa282ead8)
}

#[test]
fn crc32c_matches_the_published_check_values() {
    // CRC-32C check value (Castagnoli): "123456789" -> 0xE3069283; RFC 3720 B.4: 32 zero bytes -> 0x8A9136AA.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(masked_crc32c(b"123456789"), mask(0xE306_9283));
    assert_eq!(masked_crc32c(&[0u8; 32]), mask(0x8A91_36AA));
}

#[test]
fn record_framing_is_tfrecord() {
    let data = b"hello tensorboard";
    let r = record(data);
    let len = (data.len() as u64).to_le_bytes();
    let mut expected = Vec::new();
    expected.extend_from_slice(&len);
    expected.extend_from_slice(&mask(crc32c::crc32c(&len)).to_le_bytes());
    expected.extend_from_slice(data);
    expected.extend_from_slice(&mask(crc32c::crc32c(data)).to_le_bytes());
    assert_eq!(r, expected);
    assert_eq!(r.len(), 8 + 4 + data.len() + 4);
}

#[test]
fn event_protobufs_are_encoded_field_by_field() {
    // Event { wall_time: 1.5 (field 1, fixed64), file_version: "brain.Event:2" (field 3, bytes) }
    let mut expected = vec![0x09];
    expected.extend_from_slice(&1.5f64.to_le_bytes());
    expected.extend_from_slice(&[0x1a, 13]);
    expected.extend_from_slice(b"brain.Event:2");
    assert_eq!(file_version_event(1.5), expected);

    // Event { wall_time: 2.0, step: 3 (field 2, varint), summary (field 5) { value (1) { tag (1): "loss",
    // simple_value (2, fixed32): 0.5 } } }
    let mut value = vec![0x0a, 4];
    value.extend_from_slice(b"loss");
    value.push(0x15);
    value.extend_from_slice(&0.5f32.to_le_bytes());
    let mut summary = vec![0x0a, value.len() as u8];
    summary.extend_from_slice(&value);
    let mut expected = vec![0x09];
    expected.extend_from_slice(&2.0f64.to_le_bytes());
    expected.extend_from_slice(&[0x10, 3, 0x2a, summary.len() as u8]);
    expected.extend_from_slice(&summary);
    assert_eq!(scalars_event(2.0, 3, &[("loss", 0.5)]), expected);

    // A step above 127 takes a two-byte varint: 300 = 0xac 0x02.
    let e = scalars_event(2.0, 300, &[("loss", 0.5)]);
    assert_eq!(&e[9..12], &[0x10, 0xac, 0x02]);
}

#[test]
fn an_event_file_reads_back_record_by_record() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(tmp.path(), None).unwrap();
    w.scalars(10, &[("train/loss", 0.25), ("train/lr", 0.001)])
        .unwrap();
    w.scalars(20, &[("train/loss", 0.125)]).unwrap();
    let path = w.path().to_path_buf();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    // Read while the writer is still open: every event is on disk as soon as it is written.
    let bytes = std::fs::read(&path).unwrap();
    drop(w);
    let mut at = 0;
    let mut events = Vec::new();
    while at < bytes.len() {
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        assert_eq!(len_crc, mask(crc32c::crc32c(len_bytes)));
        let data = &bytes[at + 12..at + 12 + len];
        let data_crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
        assert_eq!(data_crc, mask(crc32c::crc32c(data)));
        events.push(data.to_vec());
        at += 16 + len;
    }
    assert_eq!(at, bytes.len());
    assert_eq!(events.len(), 3);
    assert!(events[0].ends_with(b"brain.Event:2"));
    assert!(events[1].windows(10).any(|w| w == b"train/loss"));
    assert!(events[2].windows(4).any(|w| w == 0.125f32.to_le_bytes()));
}

#[test]
fn a_resumed_writer_starts_a_session_at_its_step_so_tensorboard_purges_what_lies_past_it() {
    let tmp = tempfile::tempdir().unwrap();
    let w = EventWriter::create(tmp.path(), Some(300)).unwrap();
    let bytes = std::fs::read(w.path()).unwrap();
    // The second record: Event { wall_time, step: 300, session_log { status: START } }.
    let first = 16 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(bytes[first..first + 8].try_into().unwrap()) as usize;
    let event = &bytes[first + 12..first + 12 + len];
    assert_eq!(
        event,
        session_start_event(f64::from_le_bytes(event[1..9].try_into().unwrap()), 300)
    );
    assert_eq!(&event[9..], &[0x10, 0xac, 0x02, 0x3a, 2, 0x08, 1]); // 0x3a: field 7 (session_log), length-delimited
}
