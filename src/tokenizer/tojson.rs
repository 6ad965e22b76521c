//! The `tojson` filter of chat templates as Hugging Face transformers
//! defines it: Python's `json.dumps(value, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)`, which llama.cpp's template engine
//! follows too. minijinja's own filter escapes `<`, `>`, `&` and `'` for
//! HTML (so "user's" would reach the prompt as `user\u0027s`) and refuses
//! the keyword arguments templates pass (`tojson(ensure_ascii=False)`).

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// How `json.dumps` lays a value out.
struct Style {
    /// `None`: everything on one line; `Some(s)`: one item per line, `s`
    /// repeated once per nesting level.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// `value | tojson(ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positionally in that order or by keyword.
pub(crate) fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = match ensure_ascii {
        Some(v) => v.is_true(),
        None => kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("tojson: indent must be a number or a string, not {v}"),
                    )
                })?;
                " ".repeat(n.clamp(0, 64) as usize)
            }
        }),
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(seps) if !seps.is_none() => {
            let parts: Vec<String> = seps
                .try_iter()?
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .filter(|p: &Vec<String>| p.len() == 2)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings, e.g. (', ', ': ')",
                    )
                })?;
            (parts[0].clone(), parts[1].clone())
        }
        _ => {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        }
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let style = Style {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_value(out: &mut String, v: &Value, st: &Style, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, v),
        ValueKind::String | ValueKind::Plain => write_str(out, &v.to_string(), st.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Bytes => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_items(out, '[', ']', items.len(), st, depth, |out, i| {
                write_value(out, &items[i], st, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                keys.push((key_text(&k)?, k));
            }
            if st.sort_keys {
                keys.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_items(out, '{', '}', keys.len(), st, depth, |out, i| {
                write_str(out, &keys[i].0, st.ensure_ascii);
                out.push_str(&st.key_sep);
                write_value(out, &v.get_item(&keys[i].1)?, st, depth + 1)
            })?;
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// `n` items between `open` and `close`, written by `item(out, i)`.
fn write_items(
    out: &mut String,
    open: char,
    close: char,
    n: usize,
    st: &Style,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    for i in 0..n {
        if i > 0 {
            out.push_str(&st.item_sep);
        }
        if let Some(ind) = &st.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let (Some(ind), true) = (&st.indent, n > 0) {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// A map key as `json.dumps` writes it: strings as they are, numbers,
/// booleans and none as their JSON text.
fn key_text(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, k);
            Ok(s)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be strings or numbers, not {other}"),
        )),
    }
}

/// Integers as digits; floats as Python's `repr` (the shortest text that
/// reads back, `1.0` rather than `1`, exponent form below 1e-4 and from 1e16
/// as `1e-05` / `1e+16`) and `NaN` / `Infinity` as `json.dumps` writes them.
fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        out.push_str(&v.to_string());
        return;
    }
    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let sci = format!("{f:e}");
        let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        if f == 0.0 || (-4..16).contains(&exp) {
            let s = f.to_string();
            out.push_str(&s);
            if !s.contains('.') {
                out.push_str(".0");
            }
        } else {
            let sign = if exp < 0 { '-' } else { '+' };
            out.push_str(&format!("{mantissa}e{sign}{:02}", exp.abs()));
        }
    }
}

/// A JSON string literal with Python's escapes: `\"`, `\\`, `\n`, `\r`,
/// `\t`, `\b`, `\f`, other control characters as `\u00XX`, and with
/// `ensure_ascii` everything outside printable ASCII as `\uXXXX` (UTF-16).
fn write_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use minijinja::{context, Environment};

    fn render(src: &str) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(src, context! {}).unwrap()
    }

    // Every expected string is Python 3's `json.dumps` of the same value
    // (what transformers' `tojson` returns), printed by python3.

    #[test]
    fn matches_json_dumps_defaults() {
        let tool = r#"{"name": "get_weather", "description": "Don't <guess> & check", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}"#;
        assert_eq!(render(&format!("{{{{ {tool} | tojson }}}}")), tool);
        assert_eq!(
            render("{{ [1, 2.0, 0.5, 1e20, 0.00001, none, true, 'é😀\\n\"'] | tojson }}"),
            r#"[1, 2.0, 0.5, 1e+20, 1e-05, null, true, "é😀\n\""]"#
        );
        assert_eq!(render("{{ {} | tojson }}|{{ [] | tojson }}"), "{}|[]");
        assert_eq!(
            render("{{ [1e16, 1e15, 0.0001, -0.0, 1.5e-7] | tojson }}"),
            "[1e+16, 1000000000000000.0, 0.0001, -0.0, 1.5e-07]"
        );
    }

    #[test]
    fn keyword_arguments_of_json_dumps() {
        assert_eq!(
            render("{{ {'b': [1, {'c': []}], 'a': 'x'} | tojson(indent=2) }}"),
            "{\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    }\n  ],\n  \"a\": \"x\"\n}"
        );
        assert_eq!(
            render("{{ {'b': 1, 'a': 'é😀'} | tojson(ensure_ascii=True, sort_keys=True) }}"),
            r#"{"a": "\u00e9\ud83d\ude00", "b": 1}"#
        );
        assert_eq!(
            render("{{ {'a': [1, 2]} | tojson(separators=(',', ':')) }}"),
            r#"{"a":[1,2]}"#
        );
        assert_eq!(
            render("{{ {'a': 'é'} | tojson(ensure_ascii=False) }}"),
            r#"{"a": "é"}"#
        );
    }

    #[test]
    fn unknown_arguments_are_errors() {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        let e = env
            .render_str("{{ 1 | tojson(colour=1) }}", context! {})
            .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }
}
