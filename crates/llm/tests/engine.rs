//! The session engine on the tiny-llama fixture: warm resume, reset, capacity, cancel,
//! stop strings, and a session's tokens equal to a fresh run's.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use common::runner;
use etch_llm::{
    Engine, EngineOptions, FinishReason, ResumeReason, SamplingConfig, SessionError, TurnError,
    TurnRequest,
};

fn engine(max_sessions: usize) -> Engine {
    Engine::new(runner(1), EngineOptions { max_sessions })
}

fn request(session: Option<&str>, prompt: &[u64], max_new: usize) -> TurnRequest {
    TurnRequest {
        session: session.map(str::to_string),
        prompt: prompt.to_vec(),
        max_new_tokens: Some(max_new),
        sampling: SamplingConfig::default(),
        stop: Vec::new(),
        ignore_eos: false,
    }
}

fn no_cancel() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

fn prompt(len: usize, salt: u64) -> Vec<u64> {
    (0..len as u64).map(|i| (i * 13 + salt) % 256).collect()
}

#[test]
fn a_second_turn_that_extends_the_first_prefills_only_its_suffix() {
    let mut e = engine(3);
    let first = prompt(10, 1);
    let a = e
        .run(&request(Some("a"), &first, 5), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(a.session_reset_reason, ResumeReason::New);
    assert_eq!(a.finish_reason, FinishReason::Length);
    let reply = a.generated_token_ids.clone().unwrap();
    assert_eq!(reply.len(), 5);
    // The session holds the prompt and the whole reply.
    let mut resident = first.clone();
    resident.extend_from_slice(&reply);
    assert_eq!(e.resident_tokens("a").unwrap(), &resident[..]);

    let mut second = resident.clone();
    second.extend_from_slice(&prompt(6, 5));
    let b = e
        .run(&request(Some("a"), &second, 4), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(b.session_reset_reason, ResumeReason::ExactPrefix);
    assert_eq!(b.reused_prompt_tokens, 15);
    assert_eq!(b.prefilled_prompt_tokens, 6);

    // The same prompt in the scratch session (from the start) gives the same tokens.
    let cold = e
        .run(&request(None, &second, 4), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(cold.session_reset_reason, ResumeReason::New);
    assert_eq!(cold.generated_token_ids, b.generated_token_ids);

    // Equal and mismatching prompts start over.
    let mut again = second.clone();
    again.extend_from_slice(b.generated_token_ids.as_ref().unwrap());
    let equal = e
        .run(&request(Some("a"), &again, 2), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(equal.session_reset_reason, ResumeReason::Equal);
    assert_eq!(equal.prefilled_prompt_tokens, again.len());
    let other = e
        .run(
            &request(Some("a"), &prompt(8, 99), 2),
            no_cancel(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(other.session_reset_reason, ResumeReason::Mismatch);
}

#[test]
fn reset_empties_a_session_and_the_next_turn_matches_a_fresh_one() {
    let mut e = engine(2);
    let p = prompt(12, 3);
    let fresh = e
        .run(&request(Some("s"), &p, 6), no_cancel(), &mut |_| {})
        .unwrap();
    assert!(e.reset("s").unwrap());
    assert_eq!(e.resident_tokens("s").unwrap(), &[] as &[u64]);
    let again = e
        .run(&request(Some("s"), &p, 6), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(again.session_reset_reason, ResumeReason::New);
    assert_eq!(again.generated_token_ids, fresh.generated_token_ids);
    assert!(!e.reset("unknown").unwrap());
}

#[test]
fn capacity_is_a_typed_error_and_closing_frees_a_slot() {
    let mut e = engine(3);
    e.open("a").unwrap();
    e.open("b").unwrap();
    e.open("a").unwrap();
    assert!(matches!(
        e.open("c"),
        Err(SessionError::CapacityExhausted { named: 2, .. })
    ));
    assert!(matches!(
        e.run(&request(Some("c"), &[1, 2], 1), no_cancel(), &mut |_| {}),
        Err(TurnError::Session(SessionError::CapacityExhausted { .. }))
    ));
    assert!(e.close("a").unwrap());
    assert!(!e.close("a").unwrap());
    e.open("c").unwrap();
    let mut single = engine(1);
    assert_eq!(single.open("x"), Err(SessionError::Unsupported));
    // A budget that cannot hold another session's planned memory: a typed error too.
    let module = etch_runtime::Module::from_path(common::fixtures().join("tiny_llama_fp32.pte"))
        .load_mode(etch_runtime::LoadMode::Read)
        .max_memory(2 * 1024 * 1024)
        .threads(1)
        .build();
    if let Ok(module) = module {
        let r = etch_llm::Runner::from_parts(
            module,
            Box::new(common::ByteTokenizer),
            "forward",
            std::time::Instant::now(),
        )
        .unwrap();
        let mut tight = Engine::new(r, EngineOptions { max_sessions: 64 });
        let mut opened = 0;
        let err = loop {
            match tight.open(&format!("s{opened}")) {
                Ok(()) => opened += 1,
                Err(e) => break e,
            }
            assert!(opened < 63, "the budget never ran out");
        };
        assert!(
            matches!(err, SessionError::CapacityExhausted { .. }),
            "{err}"
        );
    }
}

#[test]
fn a_cancelled_turn_is_dirty_and_the_next_starts_over() {
    let mut e = engine(2);
    let p = prompt(9, 7);
    let cancel = Arc::new(AtomicBool::new(true));
    let c = e
        .run(&request(Some("s"), &p, 8), cancel, &mut |_| {})
        .unwrap();
    assert!(c.cancelled);
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(c.completion_tokens, 0);
    assert!(c.generated_token_ids.is_none());
    let next = e
        .run(&request(Some("s"), &p, 3), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(next.session_reset_reason, ResumeReason::Dirty);
    let fresh = e
        .run(&request(None, &p, 3), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(next.generated_token_ids, fresh.generated_token_ids);
}

#[test]
fn a_stop_string_cuts_the_text_and_dirties_the_session() {
    let mut e = engine(2);
    let p = prompt(9, 11);
    let mut plain = String::new();
    let full = e
        .run(&request(None, &p, 12), no_cancel(), &mut |t| {
            plain.push_str(t)
        })
        .unwrap();
    assert_eq!(full.completion_tokens, 12);
    // Stop at the text of the 4th to 5th generated bytes (the byte tokenizer: one id per
    // byte; only whole characters are ever emitted).
    let chars: Vec<char> = plain.chars().collect();
    if chars.len() < 6 {
        return;
    }
    let stop: String = chars[3..5].iter().collect();
    let at = plain.find(&stop).unwrap();
    let mut req = request(Some("s"), &p, 12);
    req.stop = vec![stop.clone()];
    let mut text = String::new();
    let c = e.run(&req, no_cancel(), &mut |t| text.push_str(t)).unwrap();
    assert!(c.stopped_by_string);
    assert_eq!(c.finish_reason, FinishReason::Stop);
    assert_eq!(text, plain[..at]);
    assert!(c.generated_token_ids.is_none());
    let next = e
        .run(&request(Some("s"), &p, 1), no_cancel(), &mut |_| {})
        .unwrap();
    assert_eq!(next.session_reset_reason, ResumeReason::Dirty);
}

#[test]
fn the_context_clamps_the_reply_and_a_full_prompt_is_refused() {
    let mut e = engine(1);
    let context = e.metadata().max_context_len;
    let p = prompt(context - 3, 2);
    let mut req = request(None, &p, 100);
    req.max_new_tokens = None;
    let c = e.run(&req, no_cancel(), &mut |_| {}).unwrap();
    assert_eq!(c.finish_reason, FinishReason::Length);
    assert_eq!(c.completion_tokens, 3);
    assert!(matches!(
        e.run(
            &request(None, &prompt(context, 2), 1),
            no_cancel(),
            &mut |_| {}
        ),
        Err(TurnError::ContextExceeded { .. })
    ));
}

/// A long prompt is prefilled one chunk per step, so the turns already decoding go on
/// between its chunks; it then gives the tokens it gives alone.
#[test]
fn a_long_prompt_prefills_between_the_decode_steps_of_others() {
    let long = prompt(45, 9); // two chunks of the fixture's 31-token forward
    let mut alone = engine(3);
    let want = alone
        .run(&request(Some("b"), &long, 6), no_cancel(), &mut |_| {})
        .unwrap()
        .generated_token_ids
        .unwrap();

    let mut e = engine(3);
    let a = e
        .start(&request(Some("a"), &prompt(5, 1), 12), no_cancel())
        .unwrap();
    let mut turns = vec![a];
    e.step_batch(&mut turns, &mut |_, _| {}, &mut |_, r| drop(r.unwrap()));
    assert_eq!(turns[0].generated(), 1);
    // The first chunk runs in `start`, the second in the next step, beside A's token.
    turns.push(e.start(&request(Some("b"), &long, 6), no_cancel()).unwrap());
    let decoded = e.step_batch(&mut turns, &mut |_, _| {}, &mut |_, r| drop(r.unwrap()));
    assert_eq!(decoded, 1, "only A decodes while B prefills");
    assert_eq!((turns[0].generated(), turns[1].generated()), (2, 0));
    let mut got = None;
    while got.is_none() {
        let mut done = Vec::new();
        e.step_batch(&mut turns, &mut |_, _| {}, &mut |i, r| {
            done.push((i, r.unwrap()))
        });
        for (i, c) in done.into_iter().rev() {
            if i == 1 {
                got = c.generated_token_ids;
            }
            turns.remove(i);
        }
    }
    assert_eq!(got.unwrap(), want);
}

/// Anonymous requests run side by side in scratch sessions while the capacity is not
/// taken by named ones; an idle one gives its room back to a named session; and slots
/// that come and go under running turns leave those turns in their own sessions.
#[test]
fn anonymous_turns_run_side_by_side_and_slots_come_and_go_under_running_turns() {
    let mut alone = engine(3);
    let want = |e: &mut Engine, p: &[u64]| {
        e.run(&request(None, p, 6), no_cancel(), &mut |_| {})
            .unwrap()
            .generated_token_ids
            .unwrap()
    };
    let (p1, p2, p3) = (prompt(6, 1), prompt(9, 2), prompt(4, 3));
    let (w1, w2, w3) = (
        want(&mut alone, &p1),
        want(&mut alone, &p2),
        want(&mut alone, &p3),
    );

    let mut e = engine(3);
    assert!(e.is_free(None));
    let t1 = e.start(&request(None, &p1, 6), no_cancel()).unwrap();
    assert!(e.is_free(None), "a second scratch session fits");
    let t2 = e.start(&request(None, &p2, 6), no_cancel()).unwrap();
    assert!(e.is_free(None), "a third fits: no named session is open");
    let t3 = e.start(&request(None, &p3, 6), no_cancel()).unwrap();
    assert!(!e.is_free(None), "three sessions in all");
    // A named session must wait for a scratch session to finish.
    assert!(!e.is_free(Some("a")));
    let mut turns = vec![t1, t2, t3];
    let mut got = vec![None, None, None];
    let mut order = vec![0usize, 1, 2];
    while !turns.is_empty() {
        let mut done = Vec::new();
        e.step_batch(&mut turns, &mut |_, _| {}, &mut |i, r| {
            done.push((i, r.unwrap()))
        });
        for (i, c) in done.into_iter().rev() {
            got[order[i]] = c.generated_token_ids;
            turns.remove(i);
            order.remove(i);
        }
    }
    assert_eq!(got, vec![Some(w1.clone()), Some(w2), Some(w3)]);
    // Idle scratch sessions give their room to named ones.
    assert!(e.is_free(Some("a")));
    e.open("a").unwrap();
    e.open("b").unwrap();
    assert_eq!(e.named_sessions(), 2);

    // Close a session below a running turn's: the turn stays in its own session.
    let run_b = e.start(&request(Some("b"), &p1, 6), no_cancel()).unwrap();
    assert!(e.close("a").unwrap());
    let mut turns = vec![run_b];
    let mut result = None;
    while result.is_none() {
        e.step_batch(&mut turns, &mut |_, _| {}, &mut |_, r| {
            result = Some(r.unwrap())
        });
    }
    assert_eq!(result.unwrap().generated_token_ids, Some(w1));
}
