//! Fuzzes the GGUF header parser: any input must give `Ok` or a typed error,
//! never a panic, a hang or a huge allocation, and an `Ok` header must keep
//! every tensor inside the input.
//!
//! Run with `cargo fuzz run gguf_header` from the repository root (nightly).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = longhaul::gguf::parse_header(data) {
        for t in &h.tensors {
            let end = t.offset.checked_add(t.len).expect("tensor end overflows");
            assert!(
                end <= data.len() as u64,
                "tensor `{}` outside the input",
                t.name
            );
            assert!(t.offset >= h.data_offset && t.offset % h.alignment == 0);
        }
    }
});
