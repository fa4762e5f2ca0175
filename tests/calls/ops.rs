//! Operating patterd (issue 14): `/metrics` after a simulated call (histogram buckets
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
            let (rest, le) = labels.rsplit_once(",le=").expect("le label");
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
            let count = self.get(&format!("{name}_count{{{labels}"));
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
    assert_eq!(m.check_histograms(), 5, "one series per stage");

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
