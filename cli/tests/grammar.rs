//! `longhaul run --grammar / --grammar-file / --json-schema[-file]` on
//! SmolLM2-135M-Instruct: every sampled output (temperature 1, several
//! seeds) matches the grammar or validates against the schema (checked by
//! the `jsonschema` crate); a grammar that does not compile, or a schema
//! that is not JSON, exits 1 naming the problem.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/longhaul/models")
        });
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh",
        p.display()
    );
    p
}

/// `longhaul run` on SmolLM2 (CPU, no prompt echo) plus `args`.
fn run(args: &[&str]) -> std::process::Output {
    let m = smollm2();
    Command::new(env!("CARGO_BIN_EXE_longhaul"))
        .env_remove("LONGHAUL_DEVICE")
        .stdin(Stdio::null())
        .args([
            "run",
            "-m",
            m.to_str().unwrap(),
            "-ngl",
            "0",
            "-c",
            "256",
            "-t",
            "2",
        ])
        .args(["--no-display-prompt", "--temp", "1", "-n", "80"])
        .args(args)
        .output()
        .expect("spawn longhaul run")
}

fn stdout_of(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_string()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["colour", "count"],
        "additionalProperties": false,
    })
}

fn assert_valid(text: &str, what: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"));
    let s = schema();
    let validator = jsonschema::validator_for(&s).expect("schema");
    let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {text:?}: {errors:?}");
}

#[test]
fn json_schema_flag_every_seed_validates() {
    let s = schema().to_string();
    for seed in ["1", "2", "3"] {
        let out = run(&[
            "-p",
            "A colour and a count as JSON:",
            "-s",
            seed,
            "--json-schema",
            &s,
        ]);
        assert_valid(&stdout_of(&out), &format!("--json-schema seed {seed}"));
    }
    let file = std::env::temp_dir().join(format!("longhaul-schema-{}.json", std::process::id()));
    std::fs::write(&file, &s).unwrap();
    let out = run(&[
        "-p",
        "JSON:",
        "-s",
        "4",
        "--json-schema-file",
        file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&file);
    assert_valid(&stdout_of(&out), "--json-schema-file");
}

#[test]
fn grammar_flag_every_seed_matches() {
    // The schema's language as a GBNF grammar.
    let g = r#"root ::= "{\"colour\": \"" ("red" | "green" | "blue") "\", \"count\": " [0-9] [0-9]? "}""#;
    for seed in ["1", "2", "3"] {
        let out = run(&["-p", "Colour:", "-s", seed, "--grammar", g]);
        assert_valid(&stdout_of(&out), &format!("--grammar seed {seed}"));
    }
    let file = std::env::temp_dir().join(format!("longhaul-grammar-{}.gbnf", std::process::id()));
    std::fs::write(&file, format!("{g}\n")).unwrap();
    let out = run(&[
        "-p",
        "Colour:",
        "-s",
        "4",
        "--grammar-file",
        file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_file(&file);
    assert_valid(&stdout_of(&out), "--grammar-file");
}

#[test]
fn bad_grammar_or_schema_exits_1_naming_it() {
    let cases: [(&[&str], &str); 3] = [
        (&["--grammar", "root ::= missing-rule"], "missing-rule"),
        (&["--grammar", "root ::= [a-"], "GBNF"),
        (&["--json-schema", "{not json"], "--json-schema"),
    ];
    for (args, needle) in cases {
        let out = run(&[&["-p", "x"][..], args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
