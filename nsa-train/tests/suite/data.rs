//! Data loading: the three file formats, bad inputs as one-line errors, packing and the split.

use crate::common;

use std::sync::Arc;

use nsa_train::data::batch::HostBatch;
use nsa_train::data::corpus::{is_validation, BatchOrder, DataCursor, PackedSplit, Packing};
use nsa_train::data::sources::{read_documents, read_file};
use nsa_train::data::tokenizer::{Tokenizer, BYTE_EOD};
use parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// A parquet file of an `id` column and a nullable string column `column` holding `texts`
/// (`None` a null), in one row group, as FineWeb-Edu's files hold their text.
fn write_parquet(path: &std::path::Path, column: &str, texts: &[Option<&str>]) {
    let message = format!("message docs {{ REQUIRED INT32 id; OPTIONAL BYTE_ARRAY {column} (UTF8); }}");
    let schema = Arc::new(parse_message_type(&message).unwrap());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, Default::default()).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let ids: Vec<i32> = (0..texts.len() as i32).collect();
    let mut id = group.next_column().unwrap().unwrap();
    id.typed::<Int32Type>().write_batch(&ids, None, None).unwrap();
    id.close().unwrap();
    let values: Vec<ByteArray> = texts.iter().flatten().map(|t| ByteArray::from(*t)).collect();
    let defined: Vec<i16> = texts.iter().map(|t| t.is_some() as i16).collect();
    let mut text = group.next_column().unwrap().unwrap();
    text.typed::<ByteArrayType>().write_batch(&values, Some(&defined), None).unwrap();
    text.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

#[test]
fn txt_jsonl_and_parquet_documents_are_read() {
    let dir = common::scratch("formats");
    std::fs::write(dir.join("a.txt"), "first doc\nline two\n\n\n\nsecond doc").unwrap();
    std::fs::write(dir.join("b.jsonl"), "{\"text\": \"json one\", \"id\": 1}\n\n{\"text\": \"json two\"}\n").unwrap();
    // A null row is no document.
    write_parquet(&dir.join("c.parquet"), "text", &[Some("pq one"), Some("pq two"), None, Some("pq three")]);
    std::fs::write(dir.join("ignored.bin"), [0u8, 1, 2]).unwrap();

    assert_eq!(read_file(&dir.join("a.txt")).unwrap(), vec!["first doc\nline two", "\nsecond doc"]);
    assert_eq!(read_file(&dir.join("b.jsonl")).unwrap(), vec!["json one", "json two"]);
    assert_eq!(read_file(&dir.join("c.parquet")).unwrap(), vec!["pq one", "pq two", "pq three"]);
    // A directory: its supported files in name order.
    let all = read_documents(std::slice::from_ref(&dir)).unwrap();
    assert_eq!(all.docs.len(), 7);
    assert_eq!(all.docs[2], "json one");
    // The file that is not data is named, not dropped silently.
    assert_eq!(all.skipped, vec![dir.join("ignored.bin")]);
    assert!(all.skipped_note().unwrap().contains("ignored.bin"));
}

fn one_line_error<T: std::fmt::Debug>(result: Result<T, nsa_train::data::sources::DataError>, needle: &str) {
    let err = result.expect_err("should fail").to_string();
    assert!(!err.contains('\n'), "not one line: {err}");
    assert!(err.contains(needle), "`{err}` should mention `{needle}`");
}

#[test]
fn bad_inputs_are_one_line_errors_naming_the_problem() {
    let dir = common::scratch("bad");
    one_line_error(read_documents(&[dir.join("missing.txt")]), "missing.txt: cannot open");
    std::fs::write(dir.join("bad.jsonl"), "{\"text\": \"ok\"}\n{not json\n").unwrap();
    one_line_error(read_file(&dir.join("bad.jsonl")), "bad.jsonl: line 2: invalid JSON");
    std::fs::write(dir.join("notext.jsonl"), "{\"body\": \"x\"}\n").unwrap();
    one_line_error(read_file(&dir.join("notext.jsonl")), "line 1: no `text` field");
    std::fs::write(dir.join("num.jsonl"), "{\"text\": 5}\n").unwrap();
    one_line_error(read_file(&dir.join("num.jsonl")), "`text` is not a string");
    write_parquet(&dir.join("nocol.parquet"), "body", &[Some("x")]);
    one_line_error(read_file(&dir.join("nocol.parquet")), "no `text` column");
    std::fs::write(dir.join("junk.parquet"), b"not parquet at all").unwrap();
    one_line_error(read_file(&dir.join("junk.parquet")), "not a readable parquet file");
    std::fs::write(dir.join("latin1.txt"), [b'c', b'a', 0xE9, b'\n']).unwrap();
    one_line_error(read_file(&dir.join("latin1.txt")), "not UTF-8");
    std::fs::write(dir.join("data.csv"), "a,b").unwrap();
    one_line_error(read_file(&dir.join("data.csv")), "unsupported file type");
}

#[test]
fn packing_puts_an_end_of_document_token_after_each_document() {
    let split = PackedSplit::pack(["ab", "c\u{4}d"], &Tokenizer::Bytes, 3).unwrap();
    // "ab" EOD "cd" EOD: the EOD byte inside a document is dropped.
    let want = [b'a' as u32, b'b' as u32, BYTE_EOD, b'c' as u32, b'd' as u32, BYTE_EOD];
    assert_eq!(split.num_windows(), 1);
    assert_eq!(split.window(0), &want[..4]);
}

#[test]
fn packed_documents_start_aligned_and_leave_other_documents_targets_out() {
    // Documents of 5, 2 and 13 bytes, aligned to 4, in windows of 8: "abcde" EOD pad pad |
    // "fg" EOD pad | "hijklmnopqrst" EOD.
    let split =
        PackedSplit::pack_as(["abcde", "fg", "hijklmnopqrst"], &Tokenizer::Bytes, 8, Packing::Documents, 4).unwrap();
    assert_eq!(split.num_tokens(), 8 + 4 + 14);
    assert_eq!(split.num_windows(), 3);
    let batch = HostBatch::of_windows(&split, &[0, 1, 2]);
    let starts = batch.starts.clone().expect("packed documents carry their starts");
    // Window 0: the first document and its padding. Window 1: the second, then the third from
    // position 4. Window 2: the rest of the third, a piece restarting at 0.
    let mut want = vec![0; 24];
    want[12..16].fill(4);
    assert_eq!(starts, want);
    let kept: Vec<bool> = batch.targets.iter().map(|&t| t >= 0).collect();
    // Each document's own targets count (its end-of-document id included); the end-of-document
    // position and the padding, whose targets are padding or the next document, do not.
    let want = [
        [true, true, true, true, true, false, false, false],
        [true, true, false, false, true, true, true, true],
        [true, true, true, true, true, true, true, true],
    ]
    .concat();
    assert_eq!(kept, want);
    assert_eq!(batch.targets[4], i64::from(BYTE_EOD), "a document's last target is its end-of-document id");
    assert_eq!(batch.inputs[12], i64::from(b'h'), "the third document starts at a multiple of 4");
    assert_eq!(split.documents().unwrap().targets(), 5 + 2 + 13);
    // Streamed, nothing is padded or left out.
    let stream = HostBatch::of_windows(&PackedSplit::pack(["abcde", "fg"], &Tokenizer::Bytes, 4).unwrap(), &[0]);
    assert!(stream.starts.is_none() && stream.targets.iter().all(|&t| t >= 0));
}

#[test]
fn validation_split_is_by_document_hash_and_never_overlaps() {
    let docs: Vec<String> = (0..2000).map(|i| format!("document number {i}")).collect();
    let valid: Vec<&String> = docs.iter().filter(|d| is_validation(d, 50)).collect();
    let share = valid.len() as f64 / docs.len() as f64;
    assert!((0.03..0.07).contains(&share), "validation share {share}");
    // Order-independent: the same text is always on the same side.
    let mut reversed = docs.clone();
    reversed.reverse();
    let valid_rev: Vec<&String> = reversed.iter().filter(|d| is_validation(d, 50)).collect();
    assert_eq!(valid.len(), valid_rev.len());
    assert!(valid_rev.iter().all(|d| is_validation(d, 50)));
}

#[test]
fn batch_order_is_seeded_covers_each_epoch_and_resumes_from_a_cursor() {
    let mut order = BatchOrder::new(9, 10);
    let mut cursor = DataCursor::default();
    let first: Vec<usize> = order.take(&mut cursor, 10);
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_ne!(first, (0..10).collect::<Vec<_>>(), "should be shuffled");
    let next = order.take(&mut cursor, 4);
    assert_eq!(cursor, DataCursor { epoch: 1, offset: 4 });
    // A fresh order from the same seed and a saved cursor continues identically.
    let mut again = BatchOrder::new(9, 10);
    let mut saved = DataCursor { epoch: 1, offset: 2 };
    assert_eq!(again.take(&mut saved, 2), next[2..].to_vec());
    assert_ne!(BatchOrder::new(10, 10).take(&mut DataCursor::default(), 10), first);
}
