//! Damaged safetensors files give typed errors that name the tensor where
//! known, and never panic.

use leangrad::io::{load_safetensors, load_safetensors_bytes, serialize_safetensors};
use leangrad::{DType, Device, Error, Tensor};

/// A small valid file: two tensors of different dtypes.
fn small_file() -> Vec<u8> {
    let a = Tensor::arange(6, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let b = Tensor::arange(3, DType::I64, Device::Cpu).unwrap();
    serialize_safetensors(&[("a".into(), a), ("b".into(), b)]).unwrap()
}

/// A file with `header` as its JSON header and `data` zero bytes after it.
fn craft(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data));
    v
}

fn malformed_tensor(bytes: &[u8]) -> Option<String> {
    match load_safetensors_bytes(bytes) {
        Err(Error::MalformedWeights { what, tensor, .. }) => {
            assert_eq!(what, "<bytes>");
            tensor
        }
        r => panic!("expected MalformedWeights, got {:?}", r.map(|m| m.len())),
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let file = small_file();
    assert_eq!(load_safetensors_bytes(&file).unwrap().len(), 2);
    for cut in (0..file.len()).step_by(7).chain([file.len() - 1]) {
        malformed_tensor(&file[..cut]);
    }
}

#[test]
fn flipped_header_bytes_never_panic() {
    let file = small_file();
    let header_end = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    for i in 0..header_end {
        for mask in [0x01u8, 0x20, 0x80, 0xff] {
            let mut bad = file.clone();
            bad[i] ^= mask;
            match load_safetensors_bytes(&bad) {
                Ok(_)
                | Err(Error::MalformedWeights { .. })
                | Err(Error::UnsupportedWeightDType { .. }) => {}
                Err(e) => panic!("byte {i} ^ {mask:#x}: untyped error {e}"),
            }
        }
    }
}

#[test]
fn random_mutations_never_panic() {
    let file = small_file();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    for _ in 0..3000 {
        let mut bad = file.clone();
        for _ in 0..1 + next() % 4 {
            let i = next() % bad.len();
            match next() % 3 {
                0 => bad[i] = next() as u8,
                1 => {
                    bad.remove(i);
                }
                _ => bad.insert(i, next() as u8),
            }
        }
        match load_safetensors_bytes(&bad) {
            Ok(_)
            | Err(Error::MalformedWeights { .. })
            | Err(Error::UnsupportedWeightDType { .. }) => {}
            Err(e) => panic!("untyped error {e}"),
        }
    }
}

#[test]
fn specific_faults_name_the_tensor() {
    // Not JSON.
    assert_eq!(malformed_tensor(&craft("{\"a\":", 0)), None);
    // Offsets beyond the data.
    let h = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert_eq!(malformed_tensor(&craft(h, 4)).as_deref(), Some("w"));
    // Data length that does not match shape × dtype.
    let h = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    assert_eq!(malformed_tensor(&craft(h, 8)).as_deref(), Some("w"));
    // Huge offsets and shapes must not overflow.
    let h = r#"{"w":{"dtype":"F64","shape":[4611686018427387904,8],"data_offsets":[0,18446744073709551615]}}"#;
    assert_eq!(malformed_tensor(&craft(h, 0)).as_deref(), Some("w"));
    // Offsets that are not a pair of numbers.
    let h = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#;
    assert_eq!(malformed_tensor(&craft(h, 4)).as_deref(), Some("w"));
    // Overlapping tensors (caught by the safetensors crate).
    let h = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    malformed_tensor(&craft(h, 2));
    // Header length larger than the file.
    let mut v = craft("{}", 0);
    v[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    malformed_tensor(&v);
    // A valid empty file.
    assert!(load_safetensors_bytes(&craft("{}", 0)).unwrap().is_empty());
}

#[test]
fn unsupported_dtypes_name_tensor_and_dtype() {
    let h = r#"{"q":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}}"#;
    match load_safetensors_bytes(&craft(h, 2)) {
        Err(Error::UnsupportedWeightDType { tensor, dtype }) => {
            assert_eq!((tensor.as_str(), dtype.as_str()), ("q", "I8"));
        }
        r => panic!(
            "expected UnsupportedWeightDType, got {:?}",
            r.map(|m| m.len())
        ),
    }
}

#[test]
fn file_errors_name_the_path() {
    let missing = std::env::temp_dir().join("leangrad-no-such-file.safetensors");
    match load_safetensors(&missing) {
        Err(e @ Error::File { .. }) => {
            let text = e.to_string();
            assert!(text.starts_with("cannot read "), "{text}");
            assert!(text.contains(&missing.display().to_string()), "{text}");
        }
        r => panic!("expected Error::File, got {:?}", r.map(|m| m.len())),
    }
    let path =
        std::env::temp_dir().join(format!("leangrad-bad-{}.safetensors", std::process::id()));
    std::fs::write(&path, b"not a safetensors file").unwrap();
    match load_safetensors(&path) {
        Err(Error::MalformedWeights { what, .. }) => assert_eq!(what, path.display().to_string()),
        r => panic!("expected MalformedWeights, got {:?}", r.map(|m| m.len())),
    }
    std::fs::remove_file(&path).unwrap();
}
