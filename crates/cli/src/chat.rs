//! `etch chat`: a multi-turn conversation on one KV cache, from the terminal or a pipe
//! (each stdin line is a user turn).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Context;
use etch_llm::{Conversation, LlmError, OnFull, StopReason, Turn};

/// What to do when the conversation fills the model's context.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum OnFullArg {
    /// Refuse the turn with a message (from a pipe, the chat ends with status 1;
    /// at a terminal, `/reset` starts over).
    Stop,
    /// Drop the oldest turns: the system message and the newest turns that fit are
    /// prefilled again with the new one.
    DropOldest,
}

/// Arguments of `etch chat`.
#[derive(clap::Args)]
#[command(after_help = "Commands (a line that starts with /):\n  \
    /reset          forget the conversation (the system message stays)\n  \
    /system TEXT    set the system message and start over (/system alone: none)\n  \
    /quit           end the chat (so does end of input, Ctrl-D)\n\n\
Example:\n  \
    printf 'Hi!\\nWhat did I just say?\\n' | etch chat --model models/smollm2-135m-instruct/model.pte \\\n      \
    --tokenizer models/smollm2-135m-instruct/tokenizer.json --json")]
pub struct ChatArgs {
    #[command(flatten)]
    model: crate::llm_args::ModelArgs,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: crate::llm_args::SamplingArgs,
    /// Chat template: chatml, llama3, or a Jinja file (.jinja, or a tokenizer_config.json);
    /// default: the model's own (chat_template.jinja or tokenizer_config.json beside the
    /// tokenizer), else the format the tokenizer's special tokens show.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// System message (default: the one the model's chat template adds, if any).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// When the next turn does not fit the context: stop, or drop the oldest turns.
    #[arg(long, value_enum, default_value_t = OnFullArg::Stop, value_name = "WHAT")]
    on_full: OnFullArg,
    /// Print one JSON object per turn (prompt_tokens_prefilled, context_tokens,
    /// generated_token_ids, text, stats) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// After each reply, a line of figures on stderr (tokens prefilled, context, speed).
    #[arg(long)]
    stats: bool,
}

/// One turn as `--json` prints it.
#[derive(serde::Serialize)]
struct TurnLine<'a> {
    turn: usize,
    #[serde(flatten)]
    result: &'a Turn,
}

pub fn main(args: ChatArgs) -> anyhow::Result<()> {
    let mut runner = args.model.load()?;
    let template = crate::llm_args::jinja_template(
        &runner,
        args.chat_template.as_deref(),
        &args.model.tokenizer,
    )?;
    let system = args.system.clone();
    let context = runner.metadata().max_context_len;
    let mut chat = Conversation::new(&mut runner, template, system)?;
    let on_full = match args.on_full {
        OnFullArg::Stop => OnFull::Stop,
        OnFullArg::DropOldest => OnFull::DropOldest,
    };
    let sampling = args.sampling.chat_config(&args.model.tokenizer);
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    if interactive {
        eprintln!(
            "chat with {} ({context} tokens of context): one line per turn; /reset, /system TEXT, /quit",
            args.model.model.display()
        );
    }
    let mut out = std::io::stdout();
    let mut line = String::new();
    let mut turn_index = 0;
    loop {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        if stdin
            .lock()
            .read_line(&mut line)
            .context("cannot read stdin")?
            == 0
        {
            break;
        }
        let said = line.trim_end_matches(['\n', '\r']);
        if said.trim().is_empty() {
            continue;
        }
        if let Some(command) = said.strip_prefix('/') {
            let (name, rest) = command.split_once(' ').unwrap_or((command, ""));
            match name {
                "quit" | "exit" => break,
                "reset" => {
                    chat.reset(&mut runner)?;
                    eprintln!("[conversation reset]");
                }
                "system" => {
                    let text = rest.trim();
                    let system = (!text.is_empty()).then(|| text.to_string());
                    chat.set_system(&mut runner, system)?;
                    eprintln!("[system message set; conversation reset]");
                }
                _ => eprintln!("[unknown command /{name}: /reset, /system TEXT, /quit]"),
            }
            continue;
        }
        let stream = !args.json;
        let mut on_text = |piece: &str| {
            if stream {
                let _ = out.write_all(piece.as_bytes());
                let _ = out.flush();
            }
        };
        let result = chat.turn(
            &mut runner,
            said,
            args.max_new_tokens,
            sampling,
            on_full,
            &mut on_text,
        );
        let turn = match result {
            Ok(turn) => turn,
            Err(e @ LlmError::ContextFull { .. }) if interactive => {
                eprintln!("{e}: /reset to start over, or run with --on-full drop-oldest");
                continue;
            }
            Err(e @ LlmError::ContextFull { .. }) => {
                return Err(anyhow::Error::new(e).context(
                    "the chat stops (--on-full stop; --on-full drop-oldest keeps going)",
                ));
            }
            Err(e) => return Err(e.into()),
        };
        turn_index += 1;
        if args.json {
            let line = serde_json::to_string(&TurnLine {
                turn: turn_index,
                result: &turn,
            })?;
            writeln!(out, "{line}").context("cannot write to stdout")?;
        } else {
            writeln!(out).context("cannot write to stdout")?;
        }
        out.flush().context("cannot write to stdout")?;
        if turn.dropped_turns > 0 {
            eprintln!(
                "[context full: the {} oldest turn(s) were dropped and the rest prefilled again]",
                turn.dropped_turns
            );
        }
        if turn.stop_reason == StopReason::ContextFull {
            eprintln!("[the reply filled the model's context ({context} tokens)]");
        }
        if args.stats {
            let s = &turn.stats;
            eprintln!(
                "[prefilled {} tokens, context {}/{context}, {} generated ({:?}); first token {:.0} ms, decode {:.1} tok/s]",
                turn.prompt_tokens_prefilled,
                turn.context_tokens,
                s.generated_tokens,
                turn.stop_reason,
                s.time_to_first_token_ms,
                s.decode_tokens_per_second
            );
        }
    }
    Ok(())
}
