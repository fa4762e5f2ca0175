//! The voicemail phase in whole calls on the paused clock (the real actor, policy, caller-audio
//! stage and pacer; the greetings of `tests/fixtures/voicemail/`): what lets the message go
//! when there is no beep — the greeting's silence, no greeting at all, a greeting that never
//! ends, the carrier saying it ended —, a machine reported while the agent's greeting already
//! plays, a fax, and a beep once the message is playing.

use super::*;
use crate::audio::g711::ulaw_tone;
use crate::call::EndReason;
use crate::call::policy::voicemail::{LONGEST_WAIT, NO_GREETING, SILENCE_AFTER_GREETING};
use crate::carrier::dial::Machine;

const MESSAGE: &str = "Hi, this is the clinic. Please call us back.";

/// A machine's greeting, `tests/fixtures/voicemail/<name>.ulaw`.
fn greeting(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/voicemail")
        .join(format!("{name}.ulaw"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A call the carrier says `machine` answered before its media attached.
fn machine_call(machine: Machine) -> Kit {
    let text = format!(
        "llm = \"brain\"\nstt = \"ears\"\ntts = \"voice\"\nfirst_message = \"{GREETING}\"\n"
    );
    let agent: Arc<AgentConfig> = Arc::new(toml::from_str(&text).expect("agent config"));
    let brain = ScriptedBrain::new(vec![Answer::text("Hello?")]);
    let tts = MeteredTts::new(clip("agent_voice"), 40, Duration::from_millis(200));
    let stt = ScriptedStt::new(&["you have reached the voicemail of"], 300);
    let providers = AgentProviders {
        stt: Arc::new(stt.clone()),
        tts: Arc::new(tts.clone()),
        llm: Arc::new(brain.clone()),
    };
    let call = MemoryCall::start_with(agent, providers, |h| {
        h.machine_answered(MESSAGE, machine)
            .expect("the call is live");
    })
    .expect("call starts");
    Kit {
        call,
        brain,
        stt,
        tts,
    }
}

/// Waits for the call to end after leaving the message; checks it left it whole, once, as
/// the agent's only words, never asked the brain, and said why it went (`cue`). Returns the
/// leg's state and the record.
async fn left(kit: &Kit, cue: &str) -> (LegState, CallRecord) {
    let r = tokio::time::timeout(LIMIT, kit.call.finished())
        .await
        .expect("the call ends");
    let s = kit.call.leg.state();
    assert_eq!(r.ended_reason, EndReason::VoicemailLeft, "{r:#?}");
    assert!(s.hung_up.is_some(), "the leg was not hung up");
    assert_eq!(s.agent_audio.len(), 1, "one stretch of agent audio: {s:?}");
    let (start, end) = s.agent_audio[0];
    assert!(end - start + 20 >= kit.tts.duration_ms(MESSAGE), "{s:?}");
    let agent: Vec<&str> = r
        .transcript
        .iter()
        .filter(|e| e.speaker == Speaker::Agent)
        .map(|e| e.heard_text.as_str())
        .collect();
    assert_eq!(agent, vec![MESSAGE]);
    assert!(kit.brain.turns().is_empty(), "the brain heard a machine");
    let cues: Vec<&str> = r
        .events_of(EventKind::VoicemailMessage)
        .map(|e| e.detail.as_str())
        .collect();
    assert_eq!(cues.len(), 1, "{cues:?}");
    assert!(cues[0].starts_with(&format!("cue={cue} ")), "{cues:?}");
    (s, r)
}

/// A greeting that ends without a beep: the message goes after its silence, and the
/// greeting's words are on the transcript as the machine's.
#[tokio::test(start_paused = true)]
async fn a_greeting_without_a_beep_gets_the_message_after_its_silence() {
    let kit = machine_call(Machine::Greeting);
    let audio = greeting("carrier");
    let spoken_ms = audio.len() as u64 / 8;
    kit.call.leg.say(&audio);
    let (s, r) = left(&kit, "silence").await;
    let start = s.agent_audio[0].0;
    let quiet = SILENCE_AFTER_GREETING.as_millis() as u64;
    assert!(
        (spoken_ms + quiet - 300..spoken_ms + quiet + 600).contains(&start),
        "message at {start} ms, the greeting ended at {spoken_ms} ms"
    );
    let machine: Vec<&str> = r
        .transcript
        .iter()
        .filter(|e| e.speaker == Speaker::Caller)
        .map(|e| e.text.as_str())
        .collect();
    assert_eq!(machine, vec!["you have reached the voicemail of"]);
    assert_eq!(r.events_of(EventKind::LlmRequest).count(), 0);
}

/// Nothing heard at all: the message goes after [`NO_GREETING`].
#[tokio::test(start_paused = true)]
async fn no_greeting_gets_the_message_after_a_while() {
    let kit = machine_call(Machine::Greeting);
    let (s, _) = left(&kit, "no_greeting").await;
    let wait = NO_GREETING.as_millis() as u64;
    assert!((wait..wait + 300).contains(&s.agent_audio[0].0), "{s:?}");
}

/// A greeting that goes on and on, never quiet for long: the message goes after
/// [`LONGEST_WAIT`].
#[tokio::test(start_paused = true)]
async fn an_endless_greeting_gets_the_message_at_the_longest_wait() {
    let kit = machine_call(Machine::Greeting);
    for _ in 0..5 {
        kit.call.leg.say(&greeting("dental"));
        kit.call.leg.silence(800);
    }
    let (s, _) = left(&kit, "timeout").await;
    let wait = LONGEST_WAIT.as_millis() as u64;
    assert!((wait..wait + 300).contains(&s.agent_audio[0].0), "{s:?}");
}

/// The carrier says the greeting ended: the message goes at once; the machine's beep after
/// it (heard while the message plays) changes nothing.
#[tokio::test(start_paused = true)]
async fn the_carrier_saying_the_greeting_ended_lets_the_message_go() {
    let kit = machine_call(Machine::Greeting);
    kit.call.leg.say(&greeting("sam")[..9600]);
    kit.call.leg.say(&ulaw_tone(1400.0, 400, 8000));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let told = kit.call.leg.now_ms();
    kit.call
        .handle
        .machine_answered(MESSAGE, Machine::GreetingEnded)
        .expect("live");
    let (s, r) = left(&kit, "carrier").await;
    assert!(
        (told..told + 300).contains(&s.agent_audio[0].0),
        "told at {told} ms: {s:?}"
    );
    // The beep came while the message played: the detector no longer listens.
    assert_eq!(r.events_of(EventKind::Beep).count(), 0, "{:?}", r.events);
}

/// The machine is reported while the agent's greeting already plays (detection after the
/// stream started): the greeting stops at once (`clear`) and the message waits for the beep.
#[tokio::test(start_paused = true)]
async fn a_machine_reported_during_the_greeting_stops_it_and_waits_for_the_beep() {
    let kit = call(&["hello you have reached"], Vec::new(), "");
    kit.call
        .leg
        .wait_for("the greeting playing", LIMIT, |s| s.agent_playing)
        .await;
    kit.call
        .handle
        .machine_answered(MESSAGE, Machine::Greeting)
        .expect("live");
    let s = kit
        .call
        .leg
        .wait_for("the clear", LIMIT, |s| !s.clears.is_empty())
        .await;
    let cleared = s.clears[0];
    let mut audio = greeting("sam");
    audio.extend(vec![0xFF; 3200]);
    audio.extend(ulaw_tone(1000.0, 500, 8000));
    kit.call.leg.say(&audio);
    let r = tokio::time::timeout(LIMIT, kit.call.finished())
        .await
        .expect("the call ends");
    let s = kit.call.leg.state();
    let beep_end = s.caller_clips.last().expect("the greeting played") + audio.len() as u64 / 8;
    assert_eq!(r.ended_reason, EndReason::VoicemailLeft);
    let message = s.agent_audio.last().expect("the message");
    assert!(
        message.0 > beep_end && message.0 < beep_end + 500,
        "the message at {} ms, the beep ended at {beep_end} ms (greeting cut at {cleared} ms)",
        message.0
    );
    assert!(
        s.agent_audio
            .iter()
            .all(|(start, _)| *start <= cleared || *start > beep_end),
        "{s:?}"
    );
    assert_eq!(kit.tts.spoken(), vec![GREETING, MESSAGE]);
}

/// A fax machine: hung up on, nothing said.
#[tokio::test(start_paused = true)]
async fn a_fax_is_hung_up_on() {
    let kit = machine_call(Machine::Fax);
    let r = tokio::time::timeout(LIMIT, kit.call.finished())
        .await
        .expect("the call ends");
    assert_eq!(
        r.ended_reason,
        EndReason::HungUp("a fax machine answered".into())
    );
    assert_eq!(kit.call.leg.state().agent_bytes, 0);
}
