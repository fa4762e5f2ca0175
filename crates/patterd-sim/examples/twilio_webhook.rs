//! Posts one signed Twilio voice webhook (a new inbound call) to a running patterd, as Twilio
//! would, then the same request with a forged signature; prints what came back. Exits 0 when
//! the signed one is answered 200 with TwiML and the forged one 403, else 1. Used by
//! `deploy/test-image.sh` to reach the container from the host:
//!
//! ```text
//! cargo run -q -p patterd-sim --example twilio_webhook -- --base http://127.0.0.1:8080 \
//!   --public-url https://voice.example.com --account-sid AC… --auth-token … --to +1555… --from +1555…
//! ```

use std::collections::HashMap;
use std::process::ExitCode;

use patterd_sim::twilio::{SimTwilio, new_sid, parse_twiml, voice_webhook_params};

const KEYS: [&str; 6] = [
    "base",
    "public-url",
    "account-sid",
    "auth-token",
    "to",
    "from",
];

fn args() -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let key = k
            .strip_prefix("--")
            .filter(|k| KEYS.contains(k))
            .ok_or_else(|| format!("unknown argument {k:?}; expected --{}", KEYS.join(" --")))?;
        let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
        out.insert(key.to_string(), v);
    }
    match KEYS.iter().find(|k| !out.contains_key(**k)) {
        Some(k) => Err(format!("missing --{k}")),
        None => Ok(out),
    }
}

async fn run(a: &HashMap<String, String>) -> Result<(), String> {
    let sim = SimTwilio::new(
        &a["base"],
        &a["public-url"],
        &a["account-sid"],
        &a["auth-token"],
    );
    let call_sid = new_sid("CA");
    let params = voice_webhook_params(&a["account-sid"], &call_sid, &a["from"], &a["to"]);
    let signed = sim
        .post_form("/twilio/voice", &params)
        .await
        .map_err(|e| format!("POST /twilio/voice: {e}"))?;
    println!("signed webhook for {call_sid}: {}", signed.status);
    if signed.status != 200 {
        return Err(format!("expected 200, body: {}", signed.body));
    }
    let twiml = parse_twiml(&signed.body).map_err(|e| format!("{e}: {}", signed.body))?;
    match (&twiml.stream_url, &twiml.reject) {
        (Some(url), _) => println!("TwiML: <Connect><Stream url={url:?}>"),
        (None, Some(reason)) => println!("TwiML: <Reject reason={reason:?}>"),
        (None, None) => println!("TwiML: say {:?}, hangup {}", twiml.say, twiml.hangup),
    }
    let forged_sid = new_sid("CA");
    let params = voice_webhook_params(&a["account-sid"], &forged_sid, &a["from"], &a["to"]);
    let forged = sim
        .post_form_with_signature("/twilio/voice", &params, "AAAAAAAAAAAAAAAAAAAAAAAAAAA=")
        .await
        .map_err(|e| format!("POST /twilio/voice (forged): {e}"))?;
    println!("forged webhook: {}", forged.status);
    if forged.status != 403 {
        return Err(format!(
            "a forged signature got {}, expected 403",
            forged.status
        ));
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
