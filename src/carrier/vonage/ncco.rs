//! Vonage Call Control Objects: the JSON array patterd answers the answer webhook with (and
//! sends to transfer a call). A call is connected to the media socket by a `connect` action
//! whose endpoint is `{"type":"websocket","uri":…,"content-type":"audio/l16;rate=16000",
//! "headers":{…}}` (Vonage echoes the headers in the socket's first message); a refusal is a
//! `talk`-less empty answer Vonage ends the call on, and a transfer is a `connect` to a phone
//! endpoint.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Connects the call to our media socket at `uri` with `headers` (echoed in
/// `websocket:connected`).
pub(crate) fn connect_websocket(uri: &str, headers: &BTreeMap<String, String>) -> Value {
    json!([{
        "action": "connect",
        "endpoint": [{
            "type": "websocket",
            "uri": uri,
            "content-type": super::CONTENT_TYPE,
            "headers": headers,
        }],
    }])
}

/// Ends the call: an NCCO with no actions leaves Vonage nothing to do, so it hangs up.
pub fn hang_up() -> Value {
    json!([])
}

/// Cold-transfers the call to `to` (E.164), showing `caller_id`; `ring_s` seconds of ringing.
pub(crate) fn connect_phone(to: &str, caller_id: &str, ring_s: u32) -> Value {
    json!([{
        "action": "connect",
        "from": caller_id.trim_start_matches('+'),
        "timeout": ring_s,
        "endpoint": [{"type": "phone", "number": to.trim_start_matches('+')}],
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connect_action_names_a_websocket_in_l16_16k() {
        let headers = BTreeMap::from([("call_uuid".to_string(), "u1".to_string())]);
        let n = connect_websocket("wss://x.test/vonage/media/u1?t=tok", &headers);
        let action = &n[0];
        assert_eq!(action["action"], "connect");
        let ep = &action["endpoint"][0];
        assert_eq!(ep["type"], "websocket");
        assert_eq!(ep["uri"], "wss://x.test/vonage/media/u1?t=tok");
        assert_eq!(ep["content-type"], "audio/l16;rate=16000");
        assert_eq!(ep["headers"]["call_uuid"], "u1");
        assert_eq!(n.as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn transfer_and_refusal() {
        let n = connect_phone("+15550001111", "+15550002222", 30);
        assert_eq!(n[0]["endpoint"][0]["number"], "15550001111");
        assert_eq!(n[0]["endpoint"][0]["type"], "phone");
        assert_eq!(n[0]["from"], "15550002222");
        assert_eq!(hang_up(), json!([]));
    }
}
