//! Constrained decoding over a real vocabulary (SmolLM2's byte-level BPE,
//! 49152 tokens): llama.cpp's own grammars (tests/fixtures/grammars, copies
//! of its grammars/*.gbnf) compile through our GBNF reader and llguidance,
//! and the token masks they give admit their language and refuse what is
//! outside it; JSON schemas likewise; bad grammars are typed errors.

mod common;

use common::*;
use longhaul::constrain::{ConstrainError, Constrainer, Constraint, ConstraintSpec};
use longhaul::gguf;
use longhaul::tokenizer::Tokenizer;
use serde_json::json;

fn tokenizer() -> Tokenizer {
    let path = real_model("smollm2-135m-instruct-q4_1.gguf");
    let file = gguf::Model::open(&path).expect("open");
    Tokenizer::from_metadata(file.metadata()).expect("tokenizer")
}

fn grammar(name: &str) -> ConstraintSpec {
    let p = fixture(&format!("grammars/{name}"));
    ConstraintSpec::Gbnf(
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
}

/// Feeds `text`'s tokens through `c`, checking each is allowed by the mask
/// before it is committed. `Err(i)`: token `i` was masked out.
fn feed(tok: &Tokenizer, c: &mut Constraint, text: &str) -> Result<bool, usize> {
    let ids = tok.encode(text, false, false).expect("encode");
    let mut complete = false;
    for (i, &id) in ids.iter().enumerate() {
        let mut logits = vec![0.0f32; tok.n_vocab()];
        c.apply(&mut logits).expect("mask");
        if logits[id as usize] == f32::NEG_INFINITY {
            return Err(i);
        }
        complete = c.commit(id).expect("commit");
    }
    Ok(complete)
}

#[test]
fn llamacpp_grammars_compile_and_mask_their_language() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).expect("constrainer");
    for name in [
        "json.gbnf",
        "arithmetic.gbnf",
        "list.gbnf",
        "chess.gbnf",
        "c.gbnf",
        "japanese.gbnf",
    ] {
        cz.compile(&grammar(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // (grammar, text, admitted)
    let cases = [
        (
            "json.gbnf",
            "{\"a\": [1, 2.5, true, null], \"b\": {\"c\": \"d\\n\"}}",
            true,
        ),
        ("json.gbnf", "{\"a\": tru}", false),
        ("json.gbnf", "[1, 2]", false), // root is an object
        // root is `expr "=" ws term "\n"`, and no blank follows an operator.
        ("arithmetic.gbnf", "x = (1+y2*3)\n", true),
        ("arithmetic.gbnf", "x = (1 + y2) * 3\n", false),
        ("arithmetic.gbnf", "x = = 1\n", false),
        ("list.gbnf", "- milk\n- eggs\n", true),
        ("list.gbnf", "* milk\n", false),
    ];
    for (name, text, admitted) in cases {
        let mut c = cz.compile(&grammar(name)).unwrap();
        let r = feed(&tok, &mut c, text);
        assert_eq!(r.is_ok(), admitted, "{name} on {text:?}: {r:?}");
        if admitted {
            assert!(
                c.is_accepting(),
                "{name}: {text:?} should be a complete match"
            );
        }
    }
}

#[test]
fn a_complete_grammar_ends_and_allows_end_of_generation() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let mut c = cz
        .compile(&ConstraintSpec::Gbnf("root ::= \"yes\" | \"no\"\n".into()))
        .unwrap();
    // Only tokens that begin "yes" or "no" are allowed first.
    let mut logits = vec![0.0f32; tok.n_vocab()];
    c.apply(&mut logits).unwrap();
    let allowed: Vec<String> = (0..tok.n_vocab() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .map(|i| String::from_utf8_lossy(tok.token_to_piece_with(i, false)).into_owned())
        .collect();
    assert!(!allowed.is_empty());
    assert!(
        allowed
            .iter()
            .all(|p| "yes".starts_with(p.as_str()) || "no".starts_with(p.as_str())),
        "{allowed:?}"
    );
    // "yes" completes the grammar: commit says so.
    assert_eq!(feed(&tok, &mut c, "yes"), Ok(true));
    // With a grammar that may go on, end-of-generation is allowed once it
    // matches, and only then.
    let mut c = cz
        .compile(&ConstraintSpec::Gbnf("root ::= [a-z]+\n".into()))
        .unwrap();
    let eos = tok.eos().expect("eos") as usize;
    let mut logits = vec![0.0f32; tok.n_vocab()];
    c.apply(&mut logits).unwrap();
    assert_eq!(logits[eos], f32::NEG_INFINITY);
    assert_eq!(feed(&tok, &mut c, "abc"), Ok(false));
    let mut logits = vec![0.0f32; tok.n_vocab()];
    c.apply(&mut logits).unwrap();
    assert!(logits[eos].is_finite());
    // Logits past the vocabulary are never allowed.
    let mut wide = vec![0.0f32; tok.n_vocab() + 8];
    c.apply(&mut wide).unwrap();
    assert!(wide[tok.n_vocab()..]
        .iter()
        .all(|&l| l == f32::NEG_INFINITY));
}

#[test]
fn json_schema_masks_follow_the_schema() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tag": {"enum": ["a", "b"]}},
        "required": ["n", "tag"],
        "additionalProperties": false,
    });
    let spec = ConstraintSpec::JsonSchema(schema);
    let mut c = cz.compile(&spec).unwrap();
    assert_eq!(feed(&tok, &mut c, "{\"n\": 12, \"tag\": \"b\"}"), Ok(true));
    for bad in [
        "{\"n\": \"12\"",
        "{\"tag\": \"c\"",
        "{\"n\": 1, \"x\": 2",
        "[1]",
    ] {
        let mut c = cz.compile(&spec).unwrap();
        assert!(feed(&tok, &mut c, bad).is_err(), "{bad:?} was admitted");
    }
    let mut c = cz.compile(&ConstraintSpec::json_object()).unwrap();
    assert_eq!(
        feed(&tok, &mut c, "{\"any\": [1, {\"x\": null}]}"),
        Ok(true)
    );
}

#[test]
fn bad_grammars_are_typed_errors() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let e = cz
        .compile(&ConstraintSpec::Gbnf("root ::= nope\n".into()))
        .unwrap_err();
    assert!(matches!(e, ConstrainError::Gbnf(_)), "{e:?}");
    assert!(e.to_string().contains("`nope`"), "{e}");
    let e = cz
        .compile(&ConstraintSpec::JsonSchema(
            json!({"$ref": "#/$defs/missing"}),
        ))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, ConstrainError::Schema(_)), "{e:?}");
    let e = cz
        .compile(&ConstraintSpec::Lark("start: undefined_rule\n".into()))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, ConstrainError::Grammar(_)), "{e:?}");
    let e = cz
        .compile(&ConstraintSpec::JsonSchema(json!(42)))
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, ConstrainError::Schema(_)), "{e:?}");
}

/// A chain of `n` rules, each a letter and the next rule: llguidance
/// compiles it one level of recursion per rule.
fn rule_chain(n: usize) -> String {
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g += &format!("r{i} ::= \"x\" r{}\n", i + 1);
    }
    g + &format!("r{n} ::= \"y\"\n")
}

/// Grammars and schemas that would exhaust a thread's stack (before the
/// bounds, each aborted `longhaul serve` from one request) are typed
/// errors, and a large grammar within the bounds compiles on the compiler's
/// own stack: 2,500 chained rules need about 7.5 MiB of it (3.1 KB per
/// rule, measured), far past the 2 MiB of this test's thread.
#[test]
fn grammars_too_deep_or_too_large_are_refused_and_large_ones_compile() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let err = |spec: ConstraintSpec| cz.compile(&spec).map(|_| ()).unwrap_err();

    let e = err(ConstraintSpec::Gbnf(format!(
        "root ::= {}\"a\"{}",
        "(".repeat(100_000),
        ")".repeat(100_000)
    )));
    assert!(
        matches!(e, ConstrainError::Gbnf(_)) && e.to_string().contains("nest"),
        "{e}"
    );
    let e = err(ConstraintSpec::Gbnf(format!(
        "root ::= \"a\"{}",
        "?".repeat(100_000)
    )));
    assert!(
        matches!(e, ConstrainError::Gbnf(_)) && e.to_string().contains("nest"),
        "{e}"
    );

    let e = err(ConstraintSpec::Gbnf(rule_chain(20_000)));
    assert!(
        matches!(e, ConstrainError::Grammar(_)) && e.to_string().contains("too large"),
        "{e}"
    );
    let mut lark = String::from("start: T0\n");
    for i in 0..20_000 {
        lark += &format!("T{i}: \"x\" T{}\n", i + 1);
    }
    let e = err(ConstraintSpec::Lark(lark + "T20000: \"y\"\n"));
    assert!(
        matches!(e, ConstrainError::Grammar(_)) && e.to_string().contains("too large"),
        "{e}"
    );
    let mut defs = serde_json::Map::new();
    for i in 0..10_000 {
        let next = json!({ "$ref": format!("#/$defs/a{}", i + 1) });
        defs.insert(
            format!("a{i}"),
            json!({"type": "object", "properties": {"x": next}}),
        );
    }
    defs.insert("a10000".into(), json!({"type": "integer"}));
    let e = err(ConstraintSpec::JsonSchema(
        json!({"$defs": defs, "$ref": "#/$defs/a0"}),
    ));
    assert!(
        matches!(e, ConstrainError::Schema(_)) && e.to_string().contains("too large"),
        "{e}"
    );

    let mut c = cz
        .compile(&ConstraintSpec::Gbnf(rule_chain(2_500)))
        .expect("2,500 chained rules are within the bounds");
    let mut logits = vec![0.0f32; tok.n_vocab()];
    c.apply(&mut logits).unwrap();
    let allowed: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] == 0.0).collect();
    let pieces: Vec<String> = allowed.iter().map(|&i| tok.decode(&[i as u32])).collect();
    assert!(!pieces.is_empty());
    assert!(
        pieces
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|ch| ch == 'x')),
        "{pieces:?}"
    );
}

/// Grammars and schemas whose compile time or memory grows with the square
/// of their size are refused before llguidance sees them. Before the
/// bounds, on two cores: 100,000 distinct literals took 16 s to compile
/// and 300,000 alternatives 149 s; a terminal of 16,000 optional parts
/// took 4.6 s and 1 GB (131,000: past 120 s and 16 GB); 8,000 optional
/// properties 5.1 s; and 8 MB of `a*` in a schema's pattern 23 s and 3 GB.
/// Each of those blocked a server thread for as long.
#[test]
fn grammars_and_schemas_of_quadratic_cost_are_refused() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let err = |spec: ConstraintSpec| cz.compile(&spec).map(|_| ()).unwrap_err();
    let too_large = |e: ConstrainError, schema: bool, what: &str| {
        let kind = match e {
            ConstrainError::Grammar(_) => Some(false),
            ConstrainError::Schema(_) => Some(true),
            _ => None,
        };
        let msg = e.to_string();
        assert!(
            kind == Some(schema) && msg.contains("too large") && msg.contains(what),
            "{msg}"
        )
    };
    let grammar_too_large = |e, what| too_large(e, false, what);
    let schema_too_large = |e, what| too_large(e, true, what);

    let words: Vec<String> = (0..20_000).map(|i| format!("\"w{i}\"")).collect();
    grammar_too_large(
        err(ConstraintSpec::Gbnf(format!(
            "root ::= {}",
            words.join(" ")
        ))),
        "literals",
    );
    grammar_too_large(
        err(ConstraintSpec::Gbnf(format!(
            "root ::= {}",
            words.join(" | ")
        ))),
        "alternatives",
    );
    grammar_too_large(
        err(ConstraintSpec::Lark(format!(
            "start: /{}/",
            "a*".repeat(16_000)
        ))),
        "repetitions",
    );
    grammar_too_large(
        err(ConstraintSpec::Gbnf(format!(
            "root ::= \"{}\"",
            "ab".repeat(200_000)
        ))),
        "400011 bytes",
    );

    let props = |n: usize| -> serde_json::Map<String, serde_json::Value> {
        (0..n).map(|i| (format!("p{i}"), json!(true))).collect()
    };
    schema_too_large(
        err(ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": props(8_000)}),
        )),
        "an object lists 8000 properties",
    );
    let names: Vec<String> = (0..20_000).map(|i| format!("w{i}")).collect();
    schema_too_large(
        err(ConstraintSpec::JsonSchema(
            json!({"type": "string", "enum": names}),
        )),
        "values and keys",
    );
    schema_too_large(
        err(ConstraintSpec::JsonSchema(
            json!({"type": "string", "pattern": format!("^{}$", "a*".repeat(200_000))}),
        )),
        "bytes of regular expressions",
    );

    // At the bounds, the same shapes compile and follow their grammar
    // (required properties: past about 500 optional ones, llguidance's
    // parser cannot take the first step).
    let required: Vec<String> = (0..2_048).map(|i| format!("p{i}")).collect();
    let mut c = cz
        .compile(&ConstraintSpec::JsonSchema(json!({
            "type": "object",
            "properties": props(2_048),
            "required": required,
            "additionalProperties": false,
        })))
        .expect("2,048 properties are within the bounds");
    assert_eq!(feed(&tok, &mut c, "{\"p0\": 1, \"p1\": [2]"), Ok(false));
    let mut skip = c.clone();
    assert!(
        feed(&tok, &mut skip, ", \"p3\"").is_err(),
        "p2 is required next"
    );
    assert_eq!(feed(&tok, &mut c, ", \"p2\": 3"), Ok(false));
    let mut c = cz
        .compile(&ConstraintSpec::Gbnf(format!(
            "root ::= {}",
            words[..4_000].join(" ")
        )))
        .expect("4,000 literals are within the bounds");
    let text: String = (0..4_000).map(|i| format!("w{i}")).collect();
    assert_eq!(feed(&tok, &mut c, &text), Ok(true));
}

/// A grammar the parser cannot follow (more alternatives at one point than
/// llguidance's 2,000 items per step) fails with what went wrong, not with
/// the parser's state and the request's whole grammar echoed back (as it
/// did before: some KiB of `<state>` and `<grammar>` per error).
#[test]
fn parser_errors_say_what_failed_without_the_parser_state() {
    let tok = tokenizer();
    let cz = Constrainer::new(&tok).unwrap();
    let alts: Vec<String> = (0..2_500).map(|i| format!("\"w{i}\"")).collect();
    let mut c = cz
        .compile(&ConstraintSpec::Gbnf(format!(
            "root ::= {}",
            alts.join(" | ")
        )))
        .expect("2,500 alternatives are within the bounds");
    let mut logits = vec![0.0f32; tok.n_vocab()];
    let e = c
        .apply(&mut logits)
        .and_then(|()| {
            let w = tok.encode("w", false, false).expect("encode")[0];
            c.commit(w)
        })
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ConstrainError::Decode(_)), "{e:?}");
    assert!(msg.contains("2000"), "{msg}");
    assert!(
        !msg.contains('<') && !msg.contains('\n') && msg.len() < 400,
        "{msg}"
    );
}
