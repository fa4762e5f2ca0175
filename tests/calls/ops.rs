//! Operating patterd: `/metrics` after a simulated call (histogram buckets
//! monotonic, counts equal to the turns and calls that happened), the Grafana dashboard's
//! metric names, and the cost of a call.

use std::collections::{BTreeMap, BTreeSet};

use patterd_sim::hermes::{HermesReply, HermesStep};

use crate::common::*;

/// A call with two answered turns, hung up by the caller. Returns its call id and record.
async fn two_turn_call(stack: &Stack) -> (String, patterd::call::CallRecord) {
    for _ in 0..2 {
        stack.hermes.push(HermesReply::Stream(vec![
            HermesStep::Text("Sure,".into()),
            HermesStep::Text(" here you go.".into()),
        ]));
    }
    let (call_sid, sim) = stack.call().await;
    sim.wait_for("greeting mark", WAIT, |s| !s.marks_echoed.is_empty())
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("first reply", WAIT, |s| s.marks_echoed.len() >= 2)
        .await
        .unwrap();
    speak(&sim, 600);
    sim.wait_for("second reply", WAIT, |s| s.marks_echoed.len() >= 3)
        .await
        .unwrap();
    sim.hang_up().await;
    let rec = stack.finished(&call_sid).await;
    stack
        .server
        .app
        .store
        .tx
        .flush()
        .await
        .expect("store flush");
    (call_sid, rec)
}

/// `/metrics` parsed: sample (name + labels) → value, and the declared families.
struct Exposition {
    samples: BTreeMap<String, f64>,
    families: BTreeSet<String>,
}

fn parse(text: &str) -> Exposition {
    let mut samples = BTreeMap::new();
    let mut families = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("TYPE name");
            families.insert(name.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').expect("sample line");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        assert!(samples.insert(key.to_string(), v).is_none(), "dup {key}");
    }
    Exposition { samples, families }
}

impl Exposition {
    fn get(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key}"))
    }

    /// Checks every histogram series: cumulative buckets never decrease and `+Inf` equals
    /// `_count`. Returns how many series were checked.
    fn check_histograms(&self) -> usize {
        let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for (k, v) in &self.samples {
            let Some((name, labels)) = k.split_once("_bucket{") else {
                continue;
            };
            let labels = labels.trim_end_matches('}');
            // `le` last, after the series' own labels, or alone (`_bucket{le="0.01"}`).
            let (rest, le) = labels
                .rsplit_once(",le=")
                .or_else(|| labels.strip_prefix("le=").map(|le| ("", le)))
                .expect("le label");
            let le: f64 = match le.trim_matches('"') {
                "+Inf" => f64::INFINITY,
                x => x.parse().expect("le"),
            };
            series
                .entry(format!("{name}{{{rest}}}"))
                .or_default()
                .push((le, *v));
        }
        for (s, mut buckets) in series.clone() {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert!(
                buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                "{s} buckets not monotonic: {buckets:?}"
            );
            let (name, labels) = s.split_once('{').expect("labels");
            // A series without labels of its own is written `name_count`, with no braces.
            let count = match labels {
                "}" => self.get(&format!("{name}_count")),
                _ => self.get(&format!("{name}_count{{{labels}")),
            };
            assert_eq!(buckets.last().expect("+Inf").1, count, "{s}");
        }
        series.len()
    }
}

async fn metrics(stack: &Stack) -> Exposition {
    let r = stack
        .api_client()
        .get(format!("{}/metrics", stack.base))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(r.status(), 200);
    parse(&r.text().await.expect("body"))
}

#[tokio::test]
async fn metrics_count_the_turns_and_stages_of_a_call() {
    let stack = Stack::start(Opts::default()).await;
    let (_, rec) = two_turn_call(&stack).await;
    let m = metrics(&stack).await;
    assert_eq!(
        m.check_histograms(),
        6 + 3,
        "one series per stage, the store's commit time and batch rows, and the cluster's \
         forward time (empty without a cluster)"
    );
    // The call's writes were committed in batches the store measured.
    assert!(m.get("patterd_store_commit_seconds_count") >= 1.0);
    assert!(m.get("patterd_store_batch_rows_sum") >= m.get("patterd_store_batch_rows_count"));
    assert_eq!(m.get("patterd_store_batches_failed_total"), 0.0);

    let turns = stack.hermes.record().requests.len() as f64;
    assert_eq!(turns, 2.0);
    assert_eq!(m.get("patterd_turns_total{carrier=\"twilio\"}"), turns);
    assert_eq!(
        m.get("patterd_calls_ended_total{carrier=\"twilio\",outcome=\"caller_hung_up\"}"),
        1.0
    );
    assert_eq!(
        m.get("patterd_calls_ended_total{carrier=\"twilio\",outcome=\"hung_up\"}"),
        0.0
    );
    let stage = |s: &str| m.get(&format!("patterd_stage_seconds_count{{stage=\"{s}\"}}"));
    assert_eq!(stage("stt_final_to_brain_request"), turns);
    assert_eq!(stage("brain_first_token"), turns);
    assert_eq!(
        stage("turn_end_to_reply_first_frame"),
        rec.events_of("reply_first_frame").count() as f64
    );
    assert_eq!(stage("turn_end_to_reply_first_frame"), turns);
    // Greeting and both replies were synthesised (at least once each).
    let tts = rec.events_of("tts_first_audio").count();
    assert!(tts >= 3, "{tts}");
    assert_eq!(stage("tts_first_audio"), tts as f64);
    assert_eq!(stage("barge_in_to_clear"), 0.0);
    // The first-token latency is the events' own figure: the sum is theirs.
    let first_token_s: f64 = rec
        .events_of("llm_first_token")
        .map(|e| e.detail.parse::<f64>().expect("µs") / 1e6)
        .sum();
    let sum = m.get("patterd_stage_seconds_sum{stage=\"brain_first_token\"}");
    assert!(
        (sum - first_token_s).abs() < 1e-6,
        "{sum} vs {first_token_s}"
    );
    // patterd's own share of each turn: the reply's first frame less the brain's first token
    // and the first synthesis after it, from the same events.
    assert_eq!(stage("patterd_own"), turns);
    let mut own_s = 0.0;
    let (mut brain, mut tts) = (None, None);
    for e in &rec.events {
        let us = || e.detail.parse::<f64>().ok();
        match e.kind.as_str() {
            "llm_first_token" => (brain, tts) = (us(), None),
            "tts_first_audio" if brain.is_some() && tts.is_none() => tts = us(),
            "reply_first_frame" => {
                let (b, t, r) = (
                    brain.take().expect("a first token"),
                    tts.take().expect("a synthesis"),
                    us().expect("µs"),
                );
                own_s += (r - b - t).max(0.0) / 1e6;
            }
            _ => {}
        }
    }
    let sum = m.get("patterd_stage_seconds_sum{stage=\"patterd_own\"}");
    assert!((sum - own_s).abs() < 1e-5, "{sum} vs {own_s}");
    assert_eq!(m.get("patterd_barge_ins_total{kind=\"committed\"}"), 0.0);
    assert_eq!(
        m.get("patterd_provider_errors_total{provider=\"hermes\",kind=\"llm_turn\"}"),
        0.0
    );
    assert_eq!(m.get("patterd_calls_active"), 0.0);
    assert_eq!(
        m.get("patterd_webhooks_refused_total{reason=\"replayed\"}"),
        0.0
    );

    // The dashboard names only metrics this daemon exposes.
    let dash = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana-dashboard.json"
    ))
    .expect("dashboard");
    let v: serde_json::Value = serde_json::from_str(&dash).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&v, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    for e in exprs {
        for name in metric_names(&e) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| m.families.contains(*b))
                .unwrap_or(&name);
            assert!(
                m.families.contains(base),
                "dashboard uses {name}, not exposed"
            );
        }
    }
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, v) in o {
                match (k.as_str(), v.as_str()) {
                    ("expr" | "query", Some(s)) => out.push(s.to_string()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("patterd_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

const PRICING: &str = r#"
[pricing.stt.deepgram]
usd_per_minute = 0.0043
[pricing.tts.elevenlabs]
usd_per_1k_characters = 0.18
[pricing.llm.hermes]
usd_per_1m_input_tokens = 2.5
usd_per_1m_output_tokens = 10.0
[pricing.carriers.twilio]
usd_per_minute = 0.0085
"#;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * a.abs().max(b.abs())
}

/// A call's cost is its usage (counted independently here from what the fakes saw) times the
/// configured prices, served by the REST API and MCP's `get_metrics` totals.
#[tokio::test]
async fn cost_of_a_call_is_its_usage_times_the_prices() {
    let stack = Stack::start(Opts {
        extra_config: PRICING.into(),
        ..Opts::default()
    })
    .await;
    let (call_sid, _) = two_turn_call(&stack).await;
    let api = crate::common::api::Api::authed(&stack);
    let (status, row) = api.get(&format!("/v1/calls/{call_sid}")).await;
    assert_eq!(status, 200, "{row}");
    let row = row.get("call").cloned().unwrap_or(row);
    let cost = &row["cost"];
    let usage = &cost["usage"];
    let u = |k: &str| {
        usage[k]
            .as_u64()
            .unwrap_or_else(|| panic!("usage.{k} in {row}"))
    };

    // Brain tokens: what the fake reported per turn (prompt fixed, one completion token per
    // content chunk; two chunks a reply).
    let turns = stack.hermes.record().requests.len() as u64;
    assert_eq!(turns, 2);
    assert_eq!(
        u("llm_prompt_tokens"),
        turns * patterd_sim::hermes::PROMPT_TOKENS
    );
    assert_eq!(u("llm_completion_tokens"), turns * 2);
    // TTS characters: every text ElevenLabs was asked to speak.
    let chars: u64 = stack
        .spoken()
        .iter()
        .map(|t| t.chars().count() as u64)
        .sum();
    assert_eq!(u("tts_characters"), chars);
    // STT audio: what reached the fake Deepgram (8 bytes a ms), give or take frames still in
    // flight when the caller hung up.
    let dg_bytes: u64 = stack
        .dg
        .record()
        .connections
        .iter()
        .map(|c| c.audio_bytes as u64)
        .sum();
    let stt_ms = u("stt_audio_ms");
    assert!(dg_bytes > 0);
    assert!(
        dg_bytes / 8 <= stt_ms && stt_ms <= dg_bytes / 8 + 200,
        "stt {stt_ms} ms vs {dg_bytes} bytes at Deepgram"
    );
    // Carrier minutes: the stored answer-to-end duration, within the store's clock reads.
    let duration_ms = row["duration_ms"].as_u64().expect("duration");
    let carrier_ms = u("carrier_ms");
    assert!(
        carrier_ms.abs_diff(duration_ms) < 500,
        "{carrier_ms} vs {duration_ms}"
    );

    let stt = stt_ms as f64 / 60_000.0 * 0.0043;
    let tts = chars as f64 / 1000.0 * 0.18;
    let llm = (turns * 10) as f64 / 1e6 * 2.5 + (turns * 2) as f64 / 1e6 * 10.0;
    let carrier = carrier_ms as f64 / 60_000.0 * 0.0085;
    let f = |k: &str| cost[k].as_f64().unwrap_or_else(|| panic!("{k} in {cost}"));
    assert!(close(f("stt_usd"), stt), "{cost}");
    assert!(close(f("tts_usd"), tts), "{cost}");
    assert!(close(f("llm_usd"), llm), "{cost}");
    assert!(close(f("carrier_usd"), carrier), "{cost}");
    let total = stt + tts + llm + carrier;
    assert!(close(f("total_usd"), total), "{cost}");
    assert!(close(row["cost_usd"].as_f64().expect("cost_usd"), total));
    assert!(total > 0.0);

    let (_, m) = api.get(&format!("/v1/calls/{call_sid}/metrics")).await;
    assert!(
        close(
            m["metrics"]["cost_usd_total"].as_f64().expect("total"),
            total
        ),
        "{m}"
    );
    let (_, list) = api.get("/v1/calls").await;
    let listed = list["calls"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["call_id"] == call_sid.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("{list}"));
    assert!(close(
        listed["cost_usd"].as_f64().expect("listed cost"),
        total
    ));
}

/// The timeline page of a real simulated call in headless Chromium: let in once with
/// `?token=` (exchanged for a cookie, the token gone from the address), lanes and latency bars
/// that match the call's turns, a screenshot with both lanes' colours; the call list page.
#[tokio::test]
async fn timeline_page_in_a_browser() {
    let stack = Stack::start(Opts::default()).await;
    let (call_sid, rec) = two_turn_call(&stack).await;

    // Without credentials, or with the wrong token: refused. JSON clients get JSON.
    let anon = reqwest::Client::new();
    let page = format!("{}/v1/calls/{call_sid}/timeline", stack.base);
    let r = anon.get(&page).send().await.expect("GET");
    assert_eq!(r.status(), 401);
    let r = anon
        .get(format!("{page}?token=wrong"))
        .send()
        .await
        .expect("GET");
    assert_eq!(r.status(), 401);
    let r = stack.api_client().get(&page).send().await.expect("GET");
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );

    let Some(browser) = crate::common::browser::Browser::start(&[]).await else {
        return;
    };
    let c = &browser.client;
    c.goto(&format!("{page}?token={}", stack.api_token))
        .await
        .expect("open the timeline");
    let url = c.current_url().await.expect("url");
    assert!(!url.as_str().contains("token"), "token left in {url}");
    assert!(url.path().ends_with("/timeline"), "{url}");

    let count = |sel: &str| format!("return document.querySelectorAll('{sel}').length;");
    let n = |v: serde_json::Value| v.as_u64().expect("a count");
    let callers = rec
        .transcript
        .iter()
        .filter(|t| t.speaker == patterd::call::Speaker::Caller)
        .count() as u64;
    let agents = rec.transcript.len() as u64 - callers;
    assert_eq!(callers, 2);
    assert_eq!(
        n(browser.eval(&count("#lane-caller .seg.caller")).await),
        callers
    );
    assert_eq!(
        n(browser.eval(&count("#lane-agent .seg.agent")).await),
        agents
    );
    assert_eq!(n(browser.eval(&count("#latency .turn")).await), 2);
    for stage in [
        "stt_final_to_brain_request",
        "brain_first_token",
        "tts_first_audio",
        "reply_first_frame",
    ] {
        let sel = format!("#latency .bar[data-stage={stage}]");
        assert_eq!(n(browser.eval(&count(&sel)).await), 2, "{stage}");
    }
    // Every bar has a visible width.
    let widths = browser
        .eval("return [...document.querySelectorAll('#latency .bar')].every(b => b.getBoundingClientRect().width >= 2);")
        .await;
    assert_eq!(widths, serde_json::Value::Bool(true));

    // The screenshot: saved for inspection, and both lanes' colours are in it.
    let png = c.screenshot().await.expect("screenshot");
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/timeline.png");
    std::fs::write(&out, &png).expect("save the screenshot");
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &png);
    let script = format!(
        "const img = new Image(); img.src = 'data:image/png;base64,{b64}';
         await img.decode();
         const cv = document.createElement('canvas'); cv.width = img.width; cv.height = img.height;
         const g = cv.getContext('2d'); g.drawImage(img, 0, 0);
         const d = g.getImageData(0, 0, cv.width, cv.height).data;
         const near = (i, r, gg, b) => Math.abs(d[i]-r) < 12 && Math.abs(d[i+1]-gg) < 12 && Math.abs(d[i+2]-b) < 12;
         let caller = 0, agent = 0, white = 0;
         for (let i = 0; i < d.length; i += 4) {{
           if (near(i, 0x2b, 0x7b, 0xd6)) caller++;
           if (near(i, 0xe0, 0x67, 0x2b)) agent++;
           if (near(i, 255, 255, 255)) white++;
         }}
         return [caller, agent, white, d.length / 4];"
    );
    let v = c
        .execute(&format!("return (async () => {{ {script} }})();"), vec![])
        .await
        .expect("read the screenshot's pixels");
    let px: Vec<u64> = serde_json::from_value(v).expect("pixel counts");
    assert!(px[0] > 200, "caller lane colour: {px:?}");
    assert!(px[1] > 200, "agent lane colour: {px:?}");
    assert!(px[2] < px[3], "not blank: {px:?}");

    // The call list, as a browser asks for it (the cookie lets it in).
    c.goto(&format!("{}/v1/calls", stack.base))
        .await
        .expect("open the list");
    let rows = browser
        .eval(&format!(
            "return [...document.querySelectorAll('#calls tr.call a')].map(a => a.textContent).includes('{call_sid}');"
        ))
        .await;
    assert_eq!(rows, serde_json::Value::Bool(true));
    browser.close().await;
}
