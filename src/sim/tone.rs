//! Test audio for the simulators: a minimal G.711 μ-law codec (decode per the standard
//! formula, encode with the classic 0x84 bias), a μ-law sine tone, μ-law silence, and the mean
//! absolute level the fake Deepgram uses to tell speech from silence.

/// μ-law byte → 16-bit PCM.
pub fn mulaw_decode(u: u8) -> i16 {
    let u = !u;
    let t = ((((u & 0x0F) as i32) << 3) + 0x84) << ((u & 0x70) >> 4);
    if u & 0x80 != 0 {
        (0x84 - t) as i16
    } else {
        (t - 0x84) as i16
    }
}

/// 16-bit PCM → μ-law byte.
pub fn mulaw_encode(s: i16) -> u8 {
    let mut x = s as i32;
    let sign = if x < 0 {
        x = -x;
        0x80
    } else {
        0
    };
    x = x.min(32635) + 0x84;
    let mut exp = 7;
    let mut mask = 0x4000;
    while exp > 0 && x & mask == 0 {
        exp -= 1;
        mask >>= 1;
    }
    let mant = (x >> (exp + 3)) & 0x0F;
    !((sign | (exp << 4) | mant) as u8)
}

/// `ms` of a 440 Hz tone at about -12 dBFS, μ-law 8 kHz: "speech" to the fake Deepgram.
pub fn mulaw_tone(ms: u32) -> Vec<u8> {
    let n = ms as usize * 8;
    (0..n)
        .map(|i| {
            let t = i as f64 / 8000.0;
            mulaw_encode((8000.0 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()) as i16)
        })
        .collect()
}

/// `ms` of digital silence, μ-law 8 kHz.
pub fn mulaw_silence(ms: u32) -> Vec<u8> {
    vec![0xFF; ms as usize * 8]
}

/// Mean absolute PCM level of μ-law bytes (0 for empty input).
pub fn mulaw_level(b: &[u8]) -> f64 {
    if b.is_empty() {
        return 0.0;
    }
    b.iter()
        .map(|&u| (mulaw_decode(u) as f64).abs())
        .sum::<f64>()
        / b.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_matches_fixture() {
        let raw = include_str!("../../tests/fixtures/mulaw_decode_table.json");
        let v: serde_json::Value = serde_json::from_str(raw).expect("fixture");
        let table = v
            .as_object()
            .and_then(|o| {
                o.values()
                    .find_map(|x| x.as_array().filter(|a| a.len() == 256))
            })
            .expect("a 256-entry table");
        for (i, want) in table.iter().enumerate() {
            assert_eq!(
                mulaw_decode(i as u8) as i64,
                want.as_i64().expect("int"),
                "byte {i}"
            );
        }
    }

    #[test]
    fn round_trip_and_levels() {
        for s in [-32000i16, -8000, -100, 0, 100, 8000, 32000] {
            let back = mulaw_decode(mulaw_encode(s)) as i32;
            assert!(
                (back - s as i32).abs() <= (s as i32).abs() / 16 + 8,
                "{s} -> {back}"
            );
        }
        assert_eq!(mulaw_level(&mulaw_silence(20)), 0.0);
        assert!(mulaw_level(&mulaw_tone(20)) > 3000.0);
        assert_eq!(mulaw_tone(20).len(), 160);
    }
}
