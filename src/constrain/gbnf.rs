//! GBNF (llama.cpp's grammar format, `grammars/README.md` in its tree) read
//! into a small syntax tree and written out as the Lark dialect that
//! llguidance compiles. The reading follows llama.cpp's grammar parser: a
//! rule is `name ::= alternatives` and ends at a newline outside
//! parentheses, `#` starts a comment, names are `[a-zA-Z0-9-]+`, strings
//! and character classes take the escapes `\x.. \u.... \U........ \t \r \n
//! \\ \" \[ \] \-`, and `* + ? {m} {m,} {m,n}` repeat the preceding item.
//! The start rule is `root`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

/// The deepest nesting of groups and repetitions a grammar may have (`(`
/// and each of `* + ? {..}` add a level). The reading and the writing
/// recurse per level, so a bound keeps a hostile grammar from exhausting
/// the stack; llguidance itself refuses Lark nested about 30 deep.
pub const MAX_NESTING: usize = 64;

/// A GBNF text that does not parse, with where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GBNF grammar, line {line}: {msg}")]
pub struct GbnfError {
    pub line: usize,
    pub msg: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Item {
    Literal(String),
    /// `[...]` (`negated`: `[^...]`), as inclusive char ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    /// `.`: any one character.
    Any,
    Rule(String),
    Group(Vec<Vec<Item>>),
    Repeat {
        item: Box<Item>,
        min: u64,
        max: Option<u64>,
    },
}

struct Parser<'a> {
    src: &'a [u8],
    text: &'a str,
    pos: usize,
    /// Groups open at `pos`.
    open: usize,
}

/// Levels of groups and repetitions in `it` (0 for a plain item).
fn depth(it: &Item) -> usize {
    match it {
        Item::Group(alts) => 1 + alts.iter().flatten().map(depth).max().unwrap_or(0),
        Item::Repeat { item, .. } => 1 + depth(item),
        _ => 0,
    }
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

impl<'a> Parser<'a> {
    fn err(&self, msg: impl Into<String>) -> GbnfError {
        let line = 1 + self.src[..self.pos.min(self.src.len())]
            .iter()
            .filter(|&&c| c == b'\n')
            .count();
        GbnfError {
            line,
            msg: msg.into(),
        }
    }

    fn too_deep(&self) -> GbnfError {
        self.err(format!(
            "groups and repetitions nest more than {MAX_NESTING} deep at {:?}",
            self.rest()
        ))
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\r' | b'\n')) {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word) {
            self.pos += 1;
        }
        if start == self.pos {
            return Err(self.err(format!("expected a rule name at {:?}", self.rest())));
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn int(&mut self) -> Result<u64, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        self.text[start..self.pos]
            .parse()
            .map_err(|_| self.err(format!("expected a number at {:?}", self.rest())))
    }

    fn rest(&self) -> &str {
        let end = self.text[self.pos..]
            .char_indices()
            .nth(20)
            .map_or(self.text.len(), |(i, _)| self.pos + i);
        &self.text[self.pos..end]
    }

    fn hex(&mut self, n: usize) -> Result<char, GbnfError> {
        let digits = self
            .text
            .get(self.pos..self.pos + n)
            .filter(|d| d.bytes().all(|c| c.is_ascii_hexdigit()))
            .ok_or_else(|| self.err(format!("expected {n} hex digits at {:?}", self.rest())))?;
        let v = u32::from_str_radix(digits, 16).map_err(|_| self.err("bad hex escape"))?;
        self.pos += n;
        char::from_u32(v).ok_or_else(|| self.err(format!("U+{v:X} is not a character")))
    }

    /// One possibly escaped character of a string or class.
    fn char(&mut self) -> Result<char, GbnfError> {
        let Some(c) = self.text[self.pos..].chars().next() else {
            return Err(self.err("unexpected end of the grammar"));
        };
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = self.src.get(self.pos + 1).copied();
        self.pos += 2;
        match e {
            Some(b'x') => self.hex(2),
            Some(b'u') => self.hex(4),
            Some(b'U') => self.hex(8),
            Some(b't') => Ok('\t'),
            Some(b'r') => Ok('\r'),
            Some(b'n') => Ok('\n'),
            Some(c @ (b'\\' | b'"' | b'[' | b']' | b'-')) => Ok(c as char),
            _ => {
                self.pos -= 2;
                Err(self.err(format!("unknown escape at {:?}", self.rest())))
            }
        }
    }

    fn alternates(&mut self, nested: bool) -> Result<Vec<Vec<Item>>, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>, GbnfError> {
        let mut seq: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                b'"' => {
                    self.pos += 1;
                    let mut s = String::new();
                    while self.peek() != Some(b'"') {
                        s.push(self.char()?);
                    }
                    self.pos += 1;
                    Item::Literal(s)
                }
                b'[' => {
                    self.pos += 1;
                    let negated = self.peek() == Some(b'^');
                    if negated {
                        self.pos += 1;
                    }
                    let mut ranges = Vec::new();
                    while self.peek() != Some(b']') {
                        let lo = self.char()?;
                        let hi = if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                            self.pos += 1;
                            self.char()?
                        } else {
                            lo
                        };
                        if hi < lo {
                            return Err(self.err(format!("empty range {lo:?}-{hi:?}")));
                        }
                        ranges.push((lo, hi));
                    }
                    self.pos += 1;
                    Item::Class { negated, ranges }
                }
                b'.' => {
                    self.pos += 1;
                    Item::Any
                }
                b'(' => {
                    if self.open + 1 > MAX_NESTING {
                        return Err(self.too_deep());
                    }
                    self.pos += 1;
                    self.space(true);
                    self.open += 1;
                    let alts = self.alternates(true)?;
                    self.open -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.err(format!("expected ')' at {:?}", self.rest())));
                    }
                    self.pos += 1;
                    Item::Group(alts)
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let Some(last) = seq.pop() else {
                        return Err(self.err(format!(
                            "a repetition with nothing before it at {:?}",
                            self.rest()
                        )));
                    };
                    if self.open + 1 + depth(&last) > MAX_NESTING {
                        return Err(self.too_deep());
                    }
                    self.pos += 1;
                    let (min, max) = match c {
                        b'*' => (0, None),
                        b'+' => (1, None),
                        b'?' => (0, Some(1)),
                        _ => self.braces(nested)?,
                    };
                    Item::Repeat {
                        item: Box::new(last),
                        min,
                        max,
                    }
                }
                b'<' => {
                    return Err(self.err(
                        "token references (<...>) are not supported; write the token's text as a string",
                    ))
                }
                c if is_word(c) => Item::Rule(self.name()?),
                _ => break,
            };
            seq.push(item);
            self.space(nested);
        }
        Ok(seq)
    }

    /// `{m}`, `{m,}` or `{m,n}` after the `{`.
    fn braces(&mut self, nested: bool) -> Result<(u64, Option<u64>), GbnfError> {
        self.space(nested);
        let min = self.int()?;
        self.space(nested);
        let max = match self.peek() {
            Some(b'}') => Some(min),
            Some(b',') => {
                self.pos += 1;
                self.space(nested);
                let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    Some(self.int()?)
                } else {
                    None
                };
                self.space(nested);
                if self.peek() != Some(b'}') {
                    return Err(self.err(format!("expected '}}' at {:?}", self.rest())));
                }
                max
            }
            _ => return Err(self.err(format!("expected ',' or '}}' at {:?}", self.rest()))),
        };
        self.pos += 1;
        if max.is_some_and(|m| m < min) {
            return Err(self.err(format!(
                "repetition {{{min},{}}} has max below min",
                max.unwrap_or(0)
            )));
        }
        Ok((min, max))
    }
}

/// A rule: its name and its alternatives, each a sequence of items.
type Rule = (String, Vec<Vec<Item>>);

/// Parses `gbnf` into rules in their order.
fn parse(gbnf: &str) -> Result<Vec<Rule>, GbnfError> {
    let mut p = Parser {
        src: gbnf.as_bytes(),
        text: gbnf,
        pos: 0,
        open: 0,
    };
    let mut rules: Vec<(String, Vec<Vec<Item>>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    p.space(true);
    while p.peek().is_some() {
        let name = p.name()?;
        p.space(false);
        if !p.text[p.pos..].starts_with("::=") {
            return Err(p.err(format!("expected '::=' after {name:?} at {:?}", p.rest())));
        }
        p.pos += 3;
        p.space(true);
        let alts = p.alternates(false)?;
        match p.peek() {
            None | Some(b'\r' | b'\n') => {}
            Some(_) => {
                return Err(p.err(format!("expected a newline or the end at {:?}", p.rest())))
            }
        }
        if let Some(&i) = index.get(&name) {
            // llama.cpp's parser lets a later definition replace an earlier one.
            rules[i].1 = alts;
        } else {
            index.insert(name.clone(), rules.len());
            rules.push((name, alts));
        }
        p.space(true);
    }
    Ok(rules)
}

fn refs(items: &[Item], out: &mut BTreeSet<String>) {
    for it in items {
        match it {
            Item::Rule(n) => {
                out.insert(n.clone());
            }
            Item::Group(alts) => alts.iter().for_each(|a| refs(a, out)),
            Item::Repeat { item, .. } => refs(std::slice::from_ref(item), out),
            _ => {}
        }
    }
}

/// A Lark rule name for GBNF's `name` (Lark rule names are lower case;
/// `_` never occurs in a GBNF name, so the mapping is one to one).
fn lark_name(name: &str) -> String {
    let mut s = String::from("g_");
    for c in name.chars() {
        match c {
            '-' => s.push_str("__"),
            c if c.is_ascii_uppercase() => {
                s.push('_');
                s.push(c.to_ascii_lowercase());
            }
            c => s.push(c),
        }
    }
    s
}

/// A JSON-syntax string literal (what llguidance's Lark reads).
fn lark_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_item(it: &Item, out: &mut String) {
    match it {
        Item::Literal(s) => lark_string(s, out),
        Item::Any => out.push_str(r"/(?s:.)/"),
        Item::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            for &(lo, hi) in ranges {
                let _ = write!(out, "\\x{{{:x}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, "-\\x{{{:x}}}", hi as u32);
                }
            }
            out.push_str("]/");
        }
        Item::Rule(n) => out.push_str(&lark_name(n)),
        Item::Group(alts) => {
            out.push('(');
            write_alts(alts, out);
            out.push(')');
        }
        // Lark refuses a range that ends at 0: `x{0}` matches nothing.
        Item::Repeat { max: Some(0), .. } => out.push_str("\"\""),
        Item::Repeat { item, min, max } => {
            out.push('(');
            write_item(item, out);
            out.push(')');
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
    }
}

fn write_alts(alts: &[Vec<Item>], out: &mut String) {
    for (i, seq) in alts.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        if seq.is_empty() {
            out.push_str("\"\"");
        }
        for (j, it) in seq.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            write_item(it, out);
        }
    }
}

/// The Lark grammar (llguidance's dialect) equal to the GBNF `gbnf`.
pub fn to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let rules = parse(gbnf)?;
    let defined: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    if !defined.contains("root") {
        return Err(GbnfError {
            line: 1,
            msg: "the grammar has no `root` rule (the start symbol)".into(),
        });
    }
    let mut used = BTreeSet::new();
    for (_, alts) in &rules {
        alts.iter().for_each(|a| refs(a, &mut used));
    }
    if let Some(missing) = used.iter().find(|u| !defined.contains(u.as_str())) {
        return Err(GbnfError {
            line: 1,
            msg: format!("rule `{missing}` is used but never defined"),
        });
    }
    let mut out = format!("start: {}\n", lark_name("root"));
    for (name, alts) in &rules {
        out.push_str(&lark_name(name));
        out.push_str(": ");
        write_alts(alts, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_strings_classes_and_repeats() {
        let g = "root ::= \"a\\n\" [0-9a-f]+ ws? item{2,3}  # comment\nws ::= [ \\t]*\nitem ::= (\"x\" | [^\\]\"])\n";
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g_root: \"a\\u000a\" (/[\\x{30}-\\x{39}\\x{61}-\\x{66}]/)+ (g_ws)? (g_item){2,3}\n\
             g_ws: (/[\\x{20}\\x{9}]/)*\n\
             g_item: (\"x\" | /[^\\x{5d}\\x{22}]/)\n"
        );
    }

    #[test]
    fn continuation_after_bar_and_inside_groups() {
        let g = "root ::= \"a\" |\n  \"b\"\nx-Y ::= (\n \"c\"\n | \"d\" )\n";
        let lark = to_lark(g).unwrap();
        assert!(lark.contains("g_root: \"a\" | \"b\"\n"), "{lark}");
        assert!(lark.contains("g_x___y: (\"c\" | \"d\")\n"), "{lark}");
    }

    #[test]
    fn nesting_is_bounded_before_it_can_exhaust_the_stack() {
        let groups = |n: usize| format!("root ::= {}\"a\"{}\n", "(".repeat(n), ")".repeat(n));
        let repeats = |n: usize| format!("root ::= \"a\"{}\n", "?".repeat(n));
        assert!(to_lark(&groups(MAX_NESTING)).is_ok());
        assert!(to_lark(&repeats(MAX_NESTING)).is_ok());
        // Groups and repetitions count together: 63 groups hold one `?`, not two.
        let mixed = |q: usize| {
            let n = MAX_NESTING - 1;
            format!(
                "root ::= {}\"a\"{}{}\n",
                "(".repeat(n),
                "?".repeat(q),
                ")".repeat(n)
            )
        };
        assert!(to_lark(&mixed(1)).is_ok());
        for bad in [groups(MAX_NESTING + 1), repeats(MAX_NESTING + 1), mixed(2)] {
            assert!(to_lark(&bad).unwrap_err().msg.contains("nest more than 64"));
        }
        // Far past the bound (each would overflow a thread's stack unbounded).
        assert!(to_lark(&groups(200_000)).is_err());
        assert!(to_lark(&repeats(200_000)).is_err());
        assert!(to_lark(&format!("root ::= \"a\"{}\n", "{1}".repeat(200_000))).is_err());
    }

    #[test]
    fn a_later_definition_replaces_an_earlier_one_in_place() {
        let lark = to_lark("a ::= \"1\"\nroot ::= a\na ::= \"2\"\n").unwrap();
        assert_eq!(lark, "start: g_root\ng_a: \"2\"\ng_root: g_a\n");
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(to_lark("root ::= foo\n").unwrap_err().msg.contains("`foo`"));
        assert!(to_lark("start ::= \"a\"\n")
            .unwrap_err()
            .msg
            .contains("root"));
        assert!(to_lark("root ::= \"a\n").is_err());
        assert!(to_lark("root ::= [a\n").is_err());
        assert!(to_lark("root = \"a\"\n").unwrap_err().msg.contains("::="));
        assert!(to_lark("root ::= \"\\q\"\n")
            .unwrap_err()
            .msg
            .contains("escape"));
        assert!(to_lark("root ::= * \"a\"\n").is_err());
        assert!(to_lark("root ::= \"a\"{3,1}\n").is_err());
        assert_eq!(
            to_lark("root ::= \"a\"\n\nroot2 ::= ]\n").unwrap_err().line,
            3
        );
    }
}
