//! The suite's figures: per-condition and per-family counts with 95 % Wilson intervals,
//! percentiles, and what each family's expected outcome is.

use std::collections::BTreeMap;

use super::Outcome;
use super::grid::{CONDITIONS, Kind, Scenario};

/// A rate with its 95 % Wilson score interval, as `x/n (p %, lo–hi %)`.
pub(super) fn wilson(x: usize, n: usize) -> String {
    if n == 0 {
        return "–".into();
    }
    let (xf, nf, z) = (x as f64, n as f64, 1.96f64);
    let p = xf / nf;
    let d = 1.0 + z * z / nf;
    let c = (p + z * z / (2.0 * nf)) / d;
    let h = z / d * (p * (1.0 - p) / nf + z * z / (4.0 * nf * nf)).sqrt();
    format!(
        "{x}/{n} ({:.0} %, {:.0}–{:.0})",
        p * 100.0,
        (c - h).max(0.0) * 100.0,
        (c + h).min(1.0) * 100.0
    )
}

pub(super) fn pctl(v: &[u64]) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    format!("{} / {} (n={})", at(0.5), at(0.9), v.len())
}

/// The figures of one group of outcomes, as a markdown table row.
pub(super) fn row(label: &str, rs: &[(&Scenario, &Outcome)]) -> String {
    // Rates are over the calls where the agent got to speak; stuck calls have their column.
    let of = |f: &dyn Fn(&Scenario) -> bool| -> Vec<&Outcome> {
        rs.iter()
            .filter(|(s, o)| f(s) && o.stuck.is_none())
            .map(|(_, o)| *o)
            .collect()
    };
    let stuck = rs.iter().filter(|(_, o)| o.stuck.is_some()).count();
    let non_int = of(&|s| s.kind.overlays_reply() && s.kind != Kind::Interruption);
    let ints = of(&|s| s.kind == Kind::Interruption);
    let mids = of(&|s| matches!(s.kind, Kind::MidThought { .. }));
    let dones = of(&|s| matches!(s.kind, Kind::Complete | Kind::FastTurn));
    let count = |v: &[&Outcome], f: &dyn Fn(&Outcome) -> bool| v.iter().filter(|o| f(o)).count();
    let dead: Vec<u64> = dones.iter().filter_map(|o| o.dead_air_ms).collect();
    let clear: Vec<u64> = ints.iter().filter_map(|o| o.onset_to_clear_ms).collect();
    let heard: Vec<i64> = ints.iter().filter_map(|o| o.heard_error_words).collect();
    format!(
        "| {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        wilson(stuck, rs.len()),
        wilson(count(&non_int, &|o| o.stopped), non_int.len()),
        wilson(count(&non_int, &|o| o.took_turn), non_int.len()),
        wilson(count(&ints, &|o| !o.took_turn || !o.stopped), ints.len()),
        wilson(count(&mids, &|o| o.cut), mids.len()),
        wilson(count(&dones, &|o| !o.whole_turn), dones.len()),
        pctl(&dead),
        pctl(&clear),
        wilson(heard.iter().filter(|e| e.abs() <= 1).count(), heard.len()),
    )
}

pub(super) const HEADER: &str = "| condition | agent stuck | false barge-in (stopped) | false barge-in (turn taken) | missed interruptions | mid-thought cut-offs | complete turns split or lost | dead air p50 / p90 ms | onset → clear p50 / p90 ms | heard history ±1 word |\n|---|---|---|---|---|---|---|---|---|---|";

pub(super) fn report(set: &[Scenario], outs: &[Outcome]) -> String {
    let pairs: Vec<(&Scenario, &Outcome)> = set.iter().zip(outs).collect();
    let mut t = String::from(HEADER);
    for cond in CONDITIONS {
        let rs: Vec<_> = pairs
            .iter()
            .copied()
            .filter(|(s, _)| s.cond == cond)
            .collect();
        if !rs.is_empty() {
            t.push('\n');
            t.push_str(&row(&cond.label(), &rs));
        }
    }
    t.push('\n');
    t.push_str(&row("**all**", &pairs));
    // Per family: how often the agent was stopped, and how often the scenario went as it
    // should.
    t.push_str(
        "\n\n| family | runs | agent stopped | turn taken | as expected |\n|---|---|---|---|---|",
    );
    let mut fams: Vec<&str> = set.iter().map(|s| s.kind.family()).collect();
    fams.dedup();
    fams.sort_unstable();
    fams.dedup();
    for f in fams {
        let rs: Vec<_> = pairs.iter().filter(|(s, _)| s.kind.family() == f).collect();
        let n = rs.len();
        let stopped = rs.iter().filter(|(_, o)| o.stopped).count();
        let took = rs.iter().filter(|(_, o)| o.took_turn).count();
        let ok = rs.iter().filter(|(s, o)| as_expected(s, o)).count();
        t.push_str(&format!(
            "\n| {f} | {n} | {} | {} | {} |",
            wilson(stopped, n),
            wilson(took, n),
            wilson(ok, n)
        ));
    }
    // Heard history: how many words off the stored text was, over every measured interruption.
    let mut off: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, o) in &pairs {
        if let Some(e) = o.heard_error_words {
            *off.entry(e).or_default() += 1;
        }
    }
    if !off.is_empty() {
        t.push_str("\n\nHeard history, stored minus heard (words): ");
        let parts: Vec<String> = off.iter().map(|(e, n)| format!("{e:+} ×{n}")).collect();
        t.push_str(&parts.join(", "));
    }
    let errors: Vec<String> = pairs
        .iter()
        .filter_map(|(s, o)| o.error.as_ref().map(|e| format!("{}: {e}", s.id)))
        .collect();
    let mut stuck: BTreeMap<String, usize> = BTreeMap::new();
    for (s, o) in &pairs {
        if let Some(why) = o.stuck {
            *stuck
                .entry(format!("{}: {why}", s.cond.label()))
                .or_default() += 1;
        }
    }
    if !stuck.is_empty() {
        t.push_str("\n\nAgent stuck (not in the rates above):");
        for (k, n) in stuck {
            t.push_str(&format!(" {k} ×{n};"));
        }
    }
    if !errors.is_empty() {
        t.push_str(&format!(
            "\n\nScenarios that could not be measured ({}):\n",
            errors.len()
        ));
        for e in errors {
            t.push_str(&format!("- {e}\n"));
        }
    }
    t
}

/// Whether the scenario's expected outcome happened.
pub(super) fn as_expected(s: &Scenario, o: &Outcome) -> bool {
    o.error.is_none()
        && o.stuck.is_none()
        && match s.kind {
            Kind::Interruption => o.stopped && o.took_turn,
            Kind::Backchannel | Kind::Burst | Kind::Echo { .. } => {
                !o.stopped && !o.took_turn && o.finished_reply
            }
            Kind::MidThought { .. } => !o.cut && o.whole_turn,
            Kind::Complete | Kind::FastTurn => o.whole_turn,
        }
}
