//! The one-line text of an error and its causes, as the command-line tools
//! print it.

/// `e` and its causes joined by ": ", leaving out a cause whose text the
/// message already holds: many library errors print their source in their
/// own message and also return it as `source()`, and the two would
/// otherwise read `MSG: MSG`.
pub fn message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        next = cause.source();
        let text = cause.to_string();
        if msg.is_empty() {
            msg = text;
        } else if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prints its source in its message and returns it as `source()`.
    #[derive(Debug)]
    struct InFile {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for InFile {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for InFile {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    /// Does not print its source (anyhow's `context` style).
    #[derive(Debug)]
    struct Context {
        what: &'static str,
        source: InFile,
    }

    impl std::fmt::Display for Context {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.what)
        }
    }

    impl std::error::Error for Context {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let io_text = io.to_string();
        let e = InFile {
            path: "m.gguf".into(),
            source: io,
        };
        assert_eq!(message(&e), format!("m.gguf: {io_text}"));
        let e = Context {
            what: "reading the prompt",
            source: e,
        };
        assert_eq!(
            message(&e),
            format!("reading the prompt: m.gguf: {io_text}")
        );
    }
}
