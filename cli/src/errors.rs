//! The quiet end of a command whose reader closed stdout (the one-line
//! message of other errors is [`longhaul::errors::message`]).

use std::io::Write;

/// stdout was closed by its reader (`longhaul run ... | head`): the command
/// stops generating and exits 0 without a message, as `cat` or `seq` would.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to stdout and flushes it; a closed stdout becomes
/// [`StdoutClosed`], any other failure an error that says it was stdout.
pub fn write_stdout(out: &mut impl Write, text: &str) -> anyhow::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) => Err(stdout_error(e)),
    }
}

/// [`StdoutClosed`] for a broken pipe, else `e` with "writing to stdout".
pub fn stdout_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        StdoutClosed.into()
    } else {
        anyhow::Error::new(e).context("writing to stdout")
    }
}
