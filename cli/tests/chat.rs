//! `longhaul chat` driven through a pseudo-terminal as a user drives
//! llama-cli: Ctrl-C stops a reply and keeps the conversation, `/regen`
//! replaces the last answer, arrow keys edit the line and recall history,
//! a trailing `\` continues the message, `/clear` and `/read FILE` work, and
//! Ctrl-C twice at the prompt exits.
//!
//! SmolLM2-135M-Instruct, greedy (`--temp 0`). What the model was given is
//! read from `--verbose-prompt` (the rendered prompt and its token counts on
//! stderr, as llama.cpp's flag prints them); the expected prompts are
//! SmolLM2's ChatML template (`<|im_start|>ROLE\nTEXT<|im_end|>\n`).

use std::path::PathBuf;
use std::process::Command;

use rexpect::reader::{Options, Regex};
use rexpect::session::{spawn_with_options, PtySession};

const LEFT: &str = "\x1b[D";
const UP: &str = "\x1b[A";
/// Enter, as a terminal sends it.
const ENTER: &str = "\r";

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("LONGHAUL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/longhaul/models")
        });
    let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run tools/fetch-models.sh (CI does) or set LONGHAUL_MODELS",
        p.display()
    );
    p
}

/// `longhaul chat` on SmolLM2 in a pseudo-terminal, at its first prompt.
fn chat(n_predict: u32, extra: &[&str]) -> PtySession {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_longhaul"));
    cmd.arg("chat")
        .arg("-m")
        .arg(smollm2())
        .args(["-ngl", "0", "-t", "2", "-c", "512", "--temp", "0"])
        .args(["-n", &n_predict.to_string(), "--verbose-prompt"])
        .args(extra);
    // A guard against a hung child, not a measurement. The line editor's
    // escape sequences are removed by `clean` (rexpect's own stripping eats
    // the text after private modes such as `ESC [ ? 2004 l`).
    let opts = Options::new().timeout_ms(Some(90_000));
    let mut p = spawn_with_options(cmd, opts).expect("spawn longhaul chat in a pty");
    p.exp_string("/read").expect("the command list");
    p.exp_string("> ").expect("the first prompt");
    p
}

/// One turn as the chat printed it.
#[derive(Debug)]
struct Turn {
    /// The rendered prompt the model was given.
    prompt: String,
    n_prompt: usize,
    n_reused: usize,
    /// The answer as shown.
    reply: String,
    /// `Some(n)` when Ctrl-C stopped the reply after n tokens.
    stopped: Option<usize>,
}

/// Output through a terminal without the line editor's escape sequences,
/// `\r\n` line ends and the `^C` echoed where Ctrl-C was typed.
fn clean(s: &str) -> String {
    let csi = Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").expect("regex");
    csi.replace_all(s, "")
        .replace("\r\n", "\n")
        .replace("^C", "")
}

/// Reads the verbose prompt of a turn that the typed keys have started.
fn read_prompt(p: &mut PtySession) -> (String, usize, usize) {
    p.exp_string("prompt: '").expect("the verbose prompt");
    let (prompt, counts) = p
        .exp_regex(r"'\r?\nnumber of tokens in prompt = \d+ \(\d+ reused from the cache\)\r?\n")
        .expect("the prompt's token counts");
    let nums: Vec<usize> = counts
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a count"))
        .collect();
    (clean(&prompt), nums[0], nums[1])
}

/// Reads the rest of a turn after its prompt: the reply up to the timings
/// line (after the `seen` part already read), then the next prompt.
fn read_reply(p: &mut PtySession, prompt: (String, usize, usize), seen: &str) -> Turn {
    let (reply, _) = p.exp_regex(r"\[ Prompt: ").expect("the timings line");
    p.exp_string("> ").expect("the next prompt");
    let mut reply = clean(&format!("{seen}{reply}"));
    let mut stopped = None;
    if let Some(at) = reply.find("\n[ stopped after ") {
        let n = reply[at..]
            .split(|c: char| !c.is_ascii_digit())
            .find(|s| !s.is_empty())
            .expect("a token count");
        stopped = Some(n.parse().expect("a token count"));
        reply.truncate(at);
    }
    // The timings line starts on a line of its own.
    let reply = reply.strip_suffix('\n').unwrap_or(&reply).to_string();
    Turn {
        prompt: prompt.0,
        n_prompt: prompt.1,
        n_reused: prompt.2,
        reply,
        stopped,
    }
}

/// Sends `keys` to the terminal now (rexpect buffers what it sends).
fn type_keys(p: &mut PtySession, keys: &str) {
    p.send(keys).expect("type");
    p.flush().expect("type");
}

/// Types `keys` (ending in Enter) and reads the whole turn.
fn turn(p: &mut PtySession, keys: &str) -> Turn {
    type_keys(p, keys);
    let prompt = read_prompt(p);
    read_reply(p, prompt, "")
}

fn user(text: &str) -> String {
    format!("<|im_start|>user\n{text}<|im_end|>\n")
}

fn assistant(text: &str) -> String {
    format!("<|im_start|>assistant\n{text}<|im_end|>\n")
}

const GEN_PROMPT: &str = "<|im_start|>assistant\n";

#[test]
fn ctrl_c_stops_the_reply_keeps_it_and_regen_replaces_it() {
    let mut p = chat(120, &["--system-prompt", "You are a helpful assistant."]);
    let system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n";
    // Greedy SmolLM2 answers this at length.
    let ask = "Write a long story about a dragon who learns to paint.";

    type_keys(&mut p, &format!("{ask}{ENTER}"));
    let prompt = read_prompt(&mut p);
    assert_eq!(prompt.0, format!("{system}{}{GEN_PROMPT}", user(ask)));
    // Some of the answer is on the screen: stop it there.
    let before = p.exp_string("Once upon a time").expect("the reply begins");
    p.send_control('c').expect("Ctrl-C");
    let first = read_reply(&mut p, prompt, &format!("{before}Once upon a time"));
    let n_stopped = first.stopped.expect("Ctrl-C stopped the reply");
    assert!(n_stopped < 120, "{first:?}");
    assert!(!first.reply.trim().is_empty(), "{first:?}");

    // The process lives on and the next turn sees the partial answer.
    let second = turn(&mut p, &format!("Go on.{ENTER}"));
    assert_eq!(
        second.prompt,
        format!(
            "{system}{}{}{}{GEN_PROMPT}",
            user(ask),
            assistant(&first.reply),
            user("Go on.")
        ),
    );
    // The cache kept the first turn: at least its prompt is not evaluated
    // again.
    assert!(
        second.n_reused >= first.n_prompt,
        "{second:?} after {first:?}"
    );
    assert!(second.stopped.is_none(), "{second:?}");

    // /regen drops the last answer and generates it again from the same
    // prompt; greedy, so the same answer.
    let regen = turn(&mut p, &format!("/regen{ENTER}"));
    assert_eq!(regen.prompt, second.prompt);
    assert_eq!(regen.reply, second.reply);
    // Everything but the generation prompt's last token is in the cache.
    assert_eq!(regen.n_reused, regen.n_prompt - 1, "{regen:?}");

    // The conversation holds the regenerated answer once.
    let third = turn(&mut p, &format!("Thanks.{ENTER}"));
    assert_eq!(
        third.prompt,
        format!(
            "{}{}{}{GEN_PROMPT}",
            second.prompt,
            // second.prompt ends with the generation prompt: its answer follows.
            format_args!("{}<|im_end|>\n", second.reply),
            user("Thanks.")
        ),
    );
    // The partial answer, the regenerated one, the generation prompt.
    assert_eq!(third.prompt.matches(GEN_PROMPT).count(), 3);

    // Ctrl-C at the prompt: a hint, then a second one exits.
    p.send_control('c').expect("Ctrl-C");
    p.exp_string("press Ctrl-C again").expect("the hint");
    p.send_control('c').expect("Ctrl-C");
    p.exp_string("Exiting...").expect("exit");
    p.exp_eof().expect("the process ends");
}

#[test]
fn line_editing_history_continuation_read_and_clear() {
    let mut p = chat(4, &["--system-prompt", "Be brief."]);
    let system = "<|im_start|>system\nBe brief.<|im_end|>\n";

    // Left three times, insert a character: the model gets the edited line.
    let edited = turn(&mut p, &format!("Hello wrld{LEFT}{LEFT}{LEFT}o{ENTER}"));
    assert_eq!(
        edited.prompt,
        format!("{system}{}{GEN_PROMPT}", user("Hello world"))
    );

    // Up recalls the last line from the history.
    let recalled = turn(&mut p, &format!("{UP}{ENTER}"));
    assert_eq!(
        recalled.prompt,
        format!(
            "{system}{}{}{}{GEN_PROMPT}",
            user("Hello world"),
            assistant(&edited.reply),
            user("Hello world")
        )
    );

    // A trailing backslash continues the message on the next line.
    type_keys(&mut p, &format!("first line\\{ENTER}"));
    p.exp_string("... ").expect("the continuation prompt");
    let joined = turn(&mut p, &format!("second line{ENTER}"));
    assert!(
        joined
            .prompt
            .ends_with(&format!("{}{GEN_PROMPT}", user("first line\nsecond line"))),
        "{joined:?}"
    );

    // /clear starts over with the system prompt.
    type_keys(&mut p, &format!("/clear{ENTER}"));
    p.exp_string("Chat history cleared.").expect("cleared");
    p.exp_string("> ").expect("prompt");
    let cleared = turn(&mut p, &format!("Hi.{ENTER}"));
    assert_eq!(
        cleared.prompt,
        format!("{system}{}{GEN_PROMPT}", user("Hi."))
    );
    // The system prompt is still in the cache.
    assert!(cleared.n_reused > 0, "{cleared:?}");

    // /read puts the file's text, headed by its name, before the next message.
    let dir = std::env::temp_dir().join(format!("longhaul-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("note.txt");
    std::fs::write(&file, "The password is swordfish.\n").expect("write the file");
    let file = file.to_str().expect("utf-8 path");
    type_keys(&mut p, &format!("/read {file}{ENTER}"));
    p.exp_string(&format!("Loaded text from '{file}'"))
        .expect("loaded");
    p.exp_string("> ").expect("prompt");
    let read = turn(&mut p, &format!("What is the password?{ENTER}"));
    assert!(
        read.prompt.ends_with(&format!(
            "{}{GEN_PROMPT}",
            user(&format!(
                "--- File: {file} ---\nThe password is swordfish.\nWhat is the password?"
            ))
        )),
        "{read:?}"
    );
    std::fs::remove_dir_all(&dir).ok();

    type_keys(&mut p, &format!("/exit{ENTER}"));
    p.exp_eof().expect("the process ends");
}
