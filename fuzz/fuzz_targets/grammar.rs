//! Fuzzes constrained decoding: the input is a grammar, GBNF, Lark or a
//! JSON schema as its first byte picks (0, 1, 2 modulo 3), compiled over
//! the synthetic models' byte-level vocabulary and followed for a few
//! tokens, each the first one the mask allows.
//!
//! Any `Ok` or typed error is fine. A panic, an abort (a grammar that
//! exhausts the stack), a huge allocation or a hang is a finding, and so is
//! a token the mask allowed that the grammar then refuses.
//! Seeds come from `cargo run --example fuzz_seeds`; run it with
//! `tools/fuzz.sh grammar SECONDS`.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use longhaul::constrain::{Constrainer, ConstraintSpec};
use longhaul::synth::{self, SynthSpec};
use longhaul::tokenizer::Tokenizer;

/// Tokens followed after the compile.
const N_STEPS: usize = 8;

fn setup() -> &'static (Tokenizer, Constrainer) {
    static S: OnceLock<(Tokenizer, Constrainer)> = OnceLock::new();
    S.get_or_init(|| {
        let w = synth::build(&SynthSpec::micro()).expect("the micro model");
        let tok = Tokenizer::from_metadata(w.metadata()).expect("its tokenizer");
        let cz = Constrainer::new(&tok).expect("a constrainer over it");
        (tok, cz)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let spec = match kind % 3 {
        0 => ConstraintSpec::Gbnf(text.into()),
        1 => ConstraintSpec::Lark(text.into()),
        _ => match serde_json::from_str(text) {
            Ok(v) => ConstraintSpec::JsonSchema(v),
            Err(_) => return,
        },
    };
    let (tok, cz) = setup();
    let Ok(mut c) = cz.compile(&spec) else {
        return;
    };
    let mut logits = vec![0.0f32; tok.n_vocab()];
    for _ in 0..N_STEPS {
        logits.fill(0.0);
        if c.apply(&mut logits).is_err() {
            return;
        }
        let Some(t) = logits.iter().position(|&l| l == 0.0) else {
            return;
        };
        match c.commit(t as u32) {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => panic!("token {t} was allowed, then refused: {e}"),
        }
    }
});
