//! `longhaul chat`: a conversation through the model's chat template that
//! behaves like llama-cli's.
//!
//! On a terminal the line is read with `rustyline` (editing, in-memory
//! history); otherwise plain lines are read from stdin, so pipes work. The
//! prompt (`> `) goes to stdout with the replies. A line ending in `\`
//! continues on the next one. Commands, spelled as llama-cli spells them:
//! `/exit`, `/regen` (drop the last answer and generate it again), `/clear`
//! (a new conversation that keeps the system prompt) and `/read FILE` (the
//! file's text goes into the next user message). Ctrl-D exits.
//!
//! Ctrl-C during a reply stops it: a SIGINT handler only sets a flag, which
//! the generation checks between tokens; the partial answer stays in the
//! conversation as llama-cli keeps it. Ctrl-C at the prompt prints a hint and
//! a second one in a row exits. The handler is installed only when stdin is a
//! terminal; with piped input Ctrl-C ends the process as before.
//!
//! The KV cache holds the tokens of the conversation so far (`cached`); each
//! turn evaluates only what follows the longest common prefix of the newly
//! rendered prompt and `cached`, so a stopped reply, `/regen` and `/clear`
//! leave it consistent without special cases.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use longhaul::backend::Backend;
use longhaul::constrain::Constraint;
use longhaul::engine::{Engine, EngineError, GenStats};
use longhaul::sample::Sampler;
use longhaul::spec::Drafter;
use longhaul::state::SeqState;
use longhaul::tokenizer::{ChatMessage, StreamDecoder};
use rustyline::error::ReadlineError;

/// What `chat` needs from its flags.
pub struct ChatOptions<'a> {
    pub system_prompt: Option<&'a str>,
    /// Most tokens per reply.
    pub n_predict: usize,
    /// Print each rendered prompt and its token counts on stderr
    /// (llama.cpp's `--verbose-prompt`).
    pub verbose_prompt: bool,
    /// The first user message (`run -cnv -p TEXT`), taken before the input.
    pub first: Option<String>,
    /// End after the first reply (`-st/--single-turn`).
    pub single_turn: bool,
    /// Every reply follows this grammar from its start (`--grammar`, ...).
    pub constraint: Option<&'a Constraint>,
}

/// Runs the conversation on a loaded engine until `/exit`, Ctrl-D, the end of
/// stdin or a second Ctrl-C at the prompt.
pub fn chat_loop<B: Backend>(
    engine: &Engine<B>,
    opts: &ChatOptions,
    sampler: &mut Sampler,
    mut drafter: Option<&mut Drafter>,
    model_name: &str,
) -> anyhow::Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    let mut input = if std::io::stdin().is_terminal() {
        signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())
            .context("installing the Ctrl-C handler")?;
        Input::Editor(Box::new(
            rustyline::DefaultEditor::new().context("opening the terminal for line editing")?,
        ))
    } else {
        Input::Plain(std::io::stdin().lock())
    };
    let mut conv = Conversation::new(engine, opts.system_prompt)?;
    eprintln!("chatting with {model_name}");
    eprintln!("{COMMANDS}");
    // Text of files given by /read, prepended to the next user message.
    let mut staged = String::new();
    let mut hinted = false;
    let mut first = opts.first.clone();
    loop {
        let read = match first.take() {
            Some(m) => {
                println!("> {m}");
                Read::Message(m)
            }
            None => read_message(&mut input)?,
        };
        let msg = match read {
            Read::Message(m) => m,
            Read::Eof => break,
            Read::Interrupted if hinted => break,
            Read::Interrupted => {
                println!("(press Ctrl-C again, Ctrl-D or type /exit to quit)");
                hinted = true;
                continue;
            }
        };
        hinted = false;
        if msg.is_empty() {
            continue;
        }
        match Command::parse(&msg) {
            Command::Exit => break,
            Command::Clear => {
                conv.clear();
                staged.clear();
                println!("Chat history cleared.");
                continue;
            }
            Command::Read(file) => {
                match read_text_file(file) {
                    Ok(text) => {
                        staged += &format!("--- File: {file} ---\n{text}");
                        println!("Loaded text from '{file}'");
                    }
                    Err(e) => eprintln!("error: {e:#}"),
                }
                continue;
            }
            Command::Regen => match conv.messages.last() {
                Some(m) if m.role == "assistant" => {}
                _ => {
                    eprintln!("error: no answer to regenerate yet");
                    continue;
                }
            },
            Command::Message => {}
        }
        // What the conversation was before this turn, restored if it fails.
        let before = conv.messages.len();
        let dropped = match Command::parse(&msg) {
            Command::Regen => conv.messages.pop(),
            _ => {
                conv.messages
                    .push(ChatMessage::new("user", std::mem::take(&mut staged) + &msg));
                None
            }
        };
        match conv.reply(engine, opts, sampler, drafter.as_deref_mut(), &interrupted) {
            Ok((stats, stopped)) => {
                if stopped {
                    eprint!("\n[ stopped after {} tokens ]", stats.n_gen);
                }
                let spec = match stats.spec {
                    sp if sp.n_drafted > 0 => format!(
                        " | Draft acceptance: {:.1}% ({} / {})",
                        100.0 * sp.acceptance(),
                        sp.n_accepted,
                        sp.n_drafted
                    ),
                    _ => String::new(),
                };
                eprintln!(
                    "\n[ Prompt: {:.1} t/s | Generation: {:.1} t/s{spec} ]",
                    stats.prompt_tps(),
                    stats.gen_tps()
                );
            }
            Err(TurnError::Engine(e)) => {
                conv.messages.truncate(before);
                conv.messages.extend(dropped);
                eprintln!("\nerror: {e}");
            }
            Err(TurnError::Output(e)) => return Err(e).context("writing to stdout"),
        }
        if opts.single_turn {
            break;
        }
    }
    eprintln!("\nExiting...");
    Ok(())
}

const COMMANDS: &str = "available commands:
  /exit or Ctrl-D      exit (Ctrl-C stops a reply; twice at the prompt exits)
  /regen               regenerate the last response
  /clear               clear the chat history
  /read <file>         add a text file to the next message
  \\ at a line's end    continue the message on the next line";

/// A typed line, as llama-cli reads commands (by prefix).
enum Command<'a> {
    Exit,
    Regen,
    Clear,
    Read(&'a str),
    Message,
}

impl<'a> Command<'a> {
    fn parse(msg: &'a str) -> Self {
        if msg.starts_with("/exit") {
            Command::Exit
        } else if msg.starts_with("/regen") {
            Command::Regen
        } else if msg.starts_with("/clear") {
            Command::Clear
        } else if let Some(file) = msg.strip_prefix("/read ") {
            Command::Read(file.trim())
        } else {
            Command::Message
        }
    }
}

fn read_text_file(file: &str) -> anyhow::Result<String> {
    let bytes = std::fs::read(Path::new(file))
        .with_context(|| format!("cannot read '{file}'; give a readable text file to /read"))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("'{file}' is not UTF-8 text; /read takes text files"))
}

/// Where lines come from: a line editor on a terminal, plain lines otherwise.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Plain(std::io::StdinLock<'static>),
}

enum Read {
    Message(String),
    Interrupted,
    Eof,
}

impl Input {
    /// One physical line without its line ending.
    fn line(&mut self, prompt: &str) -> anyhow::Result<Read> {
        match self {
            Input::Editor(ed) => match ed.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        // Only fails on a history size of 0, which we never set.
                        let _ = ed.add_history_entry(line.as_str());
                    }
                    Ok(Read::Message(line))
                }
                Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(ReadlineError::Eof) => Ok(Read::Eof),
                Err(e) => Err(e).context("reading the terminal"),
            },
            Input::Plain(stdin) => {
                let mut out = std::io::stdout().lock();
                write!(out, "{prompt}").and_then(|_| out.flush())?;
                let mut line = String::new();
                if stdin.read_line(&mut line).context("reading stdin")? == 0 {
                    return Ok(Read::Eof);
                }
                let n = line.trim_end_matches(['\n', '\r']).len();
                line.truncate(n);
                Ok(Read::Message(line))
            }
        }
    }
}

/// The prompt of a continued message's next line.
const CONTINUE_PROMPT: &str = "... ";

/// Reads one message: lines ending in `\` continue it (joined by newlines,
/// as llama-cli joins them).
fn read_message(input: &mut Input) -> anyhow::Result<Read> {
    println!();
    let mut msg = String::new();
    let mut prompt = "> ";
    loop {
        match input.line(prompt)? {
            Read::Message(line) => match line.strip_suffix('\\') {
                Some(head) => {
                    msg += head;
                    msg.push('\n');
                    prompt = CONTINUE_PROMPT;
                }
                None => {
                    msg += &line;
                    return Ok(Read::Message(msg));
                }
            },
            // End of input inside a continued message sends what was typed.
            Read::Eof if !msg.is_empty() => {
                msg.pop();
                return Ok(Read::Message(msg));
            }
            other => return Ok(other),
        }
    }
}

/// Why a turn failed.
enum TurnError {
    /// The engine refused (a full context, ...): the turn is dropped and the
    /// chat goes on.
    Engine(EngineError),
    /// stdout is gone: the chat ends.
    Output(std::io::Error),
}

/// The messages so far and the KV cache that holds their tokens.
struct Conversation<B: Backend> {
    system: Option<ChatMessage>,
    messages: Vec<ChatMessage>,
    kv: SeqState<B>,
    /// The tokens `kv` holds, position by position.
    cached: Vec<u32>,
}

impl<B: Backend> Conversation<B> {
    fn new(engine: &Engine<B>, system_prompt: Option<&str>) -> anyhow::Result<Self> {
        let system = system_prompt.map(|s| ChatMessage::new("system", s));
        Ok(Self {
            messages: system.iter().cloned().collect(),
            system,
            kv: engine.new_kv()?,
            cached: Vec::new(),
        })
    }

    /// A new conversation with the same system prompt. The cache is kept:
    /// the next turn reuses whatever prefix still matches.
    fn clear(&mut self) {
        self.messages = self.system.iter().cloned().collect();
    }

    /// Generates the assistant's answer to the conversation, streaming it to
    /// stdout, and appends it (as far as it got when Ctrl-C stopped it:
    /// then the flag returned is true).
    fn reply(
        &mut self,
        engine: &Engine<B>,
        opts: &ChatOptions,
        sampler: &mut Sampler,
        drafter: Option<&mut Drafter>,
        interrupted: &AtomicBool,
    ) -> Result<(GenStats, bool), TurnError> {
        let text = engine
            .apply_template(&self.messages, true)
            .map_err(TurnError::Engine)?;
        // The template spells out BOS itself where the model wants it.
        let tokens = engine
            .tokenizer
            .encode(&text, false, true)
            .map_err(|e| TurnError::Engine(e.into()))?;
        // Only the suffix after what the cache already holds is evaluated; at
        // least one token is, for the logits.
        let common = self
            .cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        // A recurrent (hybrid) model goes back only to a checkpoint: the
        // end of an earlier turn, or the start.
        let common = match self.kv.rewind(&engine.model.backend, common) {
            Ok(n) => n,
            Err(e) => return Err(TurnError::Engine(e.into())),
        };
        self.cached.truncate(common);
        if opts.verbose_prompt {
            eprintln!("prompt: '{text}'");
            eprintln!(
                "number of tokens in prompt = {} ({common} reused from the cache)",
                tokens.len()
            );
        }
        interrupted.store(false, Ordering::Relaxed);
        let mut dec = StreamDecoder::new(false);
        let mut shown = String::new();
        let mut out = std::io::stdout().lock();
        let mut io_err = None;
        let mut stopped = false;
        let mut constraint = opts.constraint.cloned();
        let on_token = |tok| {
            let piece = dec.push(&engine.tokenizer, tok);
            shown += &piece;
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                io_err = Some(e);
                return false;
            }
            stopped = interrupted.load(Ordering::Relaxed);
            !stopped
        };
        let prompt = &tokens[common..];
        let res = match drafter {
            // The drafter sees the earlier turns the cache holds.
            Some(d) if constraint.is_none() => engine.generate_spec_after(
                &mut self.kv,
                &self.cached,
                prompt,
                opts.n_predict,
                sampler,
                d,
                on_token,
            ),
            _ => engine.generate_constrained(
                &mut self.kv,
                prompt,
                opts.n_predict,
                sampler,
                constraint.as_mut(),
                on_token,
            ),
        };
        // A failed evaluation may have filled part of the cache past
        // `cached`; the next turn truncates to the common prefix again.
        let (reply, stats) = res.map_err(TurnError::Engine)?;
        let tail = dec.finish();
        shown += &tail;
        let flushed = out.write_all(tail.as_bytes()).and_then(|_| out.flush());
        if let Some(e) = io_err.map_or(flushed.err(), Some) {
            return Err(TurnError::Output(e));
        }
        // Every sampled token but the last was evaluated into the cache.
        self.cached.extend_from_slice(&tokens[common..]);
        self.cached
            .extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        // A hybrid model's next turn starts from here (no-op otherwise); a
        // checkpoint that cannot be made only costs a longer next prompt.
        let _ = self.kv.checkpoint(&engine.model.backend);
        self.messages.push(ChatMessage::new("assistant", shown));
        Ok((stats, stopped))
    }
}
