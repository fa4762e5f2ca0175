//! The pacer's batching: top-ups of [`TOP_UP`](super::TOP_UP) on the shared
//! [`TICK`](super::TICK) grid.

use super::*;

fn frames(p: &Pumped) -> usize {
    p.commands
        .iter()
        .filter(|c| matches!(c, MediaCommand::Audio(_)))
        .count()
}

#[tokio::test]
async fn pacer_tops_up_in_batches_on_the_shared_tick() {
    let mut s = Mouth::new();
    let audio = vec![0x55u8; 8000 * 3];
    s.push_audio(UttKind::Say, "three seconds".into(), 0, &audio);
    let t0 = Instant::now();
    assert_eq!(frames(&s.pump(t0)), 50, "one second of lead at once");
    assert_eq!(s.unplayed(t0), LEAD);
    let mut now = t0;
    let mut wakes = 0;
    let mut sent = 50;
    while sent < 150 {
        let at = s.next_deadline(now).expect("more to send");
        assert!(at > now, "the pacer waits for the carrier to drain");
        assert_eq!(on_tick(at), at, "deadlines fall on the shared tick");
        now = at;
        let n = frames(&s.pump(now));
        assert!(n >= 1, "a wake-up that sends nothing");
        // Topped up to LEAD (within a frame), never further (the last top-up runs out of
        // audio first).
        assert!(s.unplayed(now) < LEAD + TICK);
        if sent + n < 150 {
            assert!(s.unplayed(now) >= LEAD);
        }
        sent += n;
        wakes += 1;
    }
    // 100 frames after the first second took about 100 / 5 wake-ups, not 100.
    assert!(wakes <= 22, "{wakes} wake-ups for 100 frames");
    // The caller has heard all but what is unplayed: frames sent minus real time.
    let heard = Duration::from_millis(20 * sent as u64) - s.unplayed(now);
    assert!(heard.abs_diff(now - t0) <= Duration::from_millis(1));
}
