use super::*;
use crate::provider::ChatMessage;

fn filt(parts: &[&str]) -> String {
    let mut f = ThinkFilter::default();
    let mut s: String = parts.iter().map(|p| f.push(p)).collect();
    s.push_str(&f.finish());
    s
}

#[test]
fn think_spans_removed_even_when_split() {
    assert_eq!(filt(&["a<think>x</think>b"]), "ab");
    assert_eq!(filt(&["a<th", "ink>x</thi", "nk>b"]), "ab");
    assert_eq!(filt(&["<think>", "never", " closed"]), "");
    assert_eq!(filt(&["a < b", " <t", "ea>"]), "a < b <tea>");
    assert_eq!(filt(&["x<", "/think>y"]), "x</think>y");
}

struct OneTool;

impl crate::provider::ToolRunner for OneTool {
    fn specs(&self) -> Vec<crate::provider::ToolSpec> {
        vec![crate::provider::ToolSpec {
            name: "end_call".into(),
            description: "End the call.".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }]
    }
    fn max_rounds(&self) -> u32 {
        4
    }
    fn run(&self, _: ToolCall) -> crate::provider::ToolFuture {
        Box::pin(async { crate::provider::ToolOutput::ok("done") })
    }
}

fn client(kind: &str) -> OpenAiChat {
    let cfg: LlmConfig = toml::from_str(&format!(
        "kind = \"{kind}\"\nbase_url = \"http://127.0.0.1:9/v1\"\napi_key = \"k\""
    ))
    .unwrap();
    OpenAiChat::new(&cfg).unwrap()
}

#[test]
fn tools_are_offered_to_compatible_brains_and_never_to_hermes() {
    let turn = ChatTurn {
        call_id: "CA1".into(),
        caller: None,
        system_prompt: String::new(),
        history: vec![ChatMessage {
            role: Role::User,
            content: "bye".into(),
        }],
        history_limits: Default::default(),
        tools: Some(Tools(std::sync::Arc::new(OneTool))),
        call_token: Some(crate::util::secret::Secret::new("pdc1.x.y")),
        trace: None,
    };
    let (_, body) = client("openai_compatible").build_request(&turn);
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "end_call");
    let (_, body) = client("hermes").build_request(&turn);
    assert!(body.get("tools").is_none(), "{body}");
}

/// The call token goes to Hermes (the brain that holds patterd's MCP), not to a hosted
/// model unless its entry says `send_call_token = true`.
#[test]
fn the_call_token_goes_to_hermes_only_by_default() {
    let turn = ChatTurn {
        call_id: "CA1".into(),
        caller: None,
        system_prompt: String::new(),
        history: Vec::new(),
        history_limits: Default::default(),
        tools: None,
        call_token: Some(crate::util::secret::Secret::new("pdc1.Q0Ex.tag")),
        trace: None,
    };
    let token = |c: &OpenAiChat| {
        let (headers, _) = c.build_request(&turn);
        headers
            .into_iter()
            .find(|(k, _)| k == "X-Patterd-Call-Token")
            .map(|(_, v)| v)
    };
    assert_eq!(token(&client("hermes")).as_deref(), Some("pdc1.Q0Ex.tag"));
    assert_eq!(token(&client("openai_compatible")), None);
    let mut opted = client("openai_compatible");
    opted.cfg.send_call_token = Some(true);
    assert_eq!(token(&opted).as_deref(), Some("pdc1.Q0Ex.tag"));
}

#[test]
fn a_compatible_request_carries_a_bounded_history_and_the_system_prompt() {
    let history: Vec<ChatMessage> = (0..100)
        .flat_map(|n| {
            [
                ChatMessage {
                    role: Role::User,
                    content: format!("question {n}"),
                },
                ChatMessage {
                    role: Role::Assistant,
                    content: format!("answer {n}"),
                },
            ]
        })
        .collect();
    let turn = ChatTurn {
        call_id: "CA1".into(),
        caller: None,
        system_prompt: "You are the front desk.".into(),
        history,
        history_limits: crate::provider::history::HistoryLimits {
            max_turns: 3,
            max_bytes: 1 << 20,
        },
        tools: None,
        call_token: None,
        trace: None,
    };
    let (_, body) = client("openai_compatible").build_request(&turn);
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 1 + 2 * 3, "{body}");
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["content"], "You are the front desk.");
    assert_eq!(messages[1]["content"], "question 97");
    assert_eq!(messages[6]["content"], "answer 99");
}

#[test]
fn caller_key_is_stable() {
    let secret = "s".repeat(32);
    let key = |c: &str| caller_key(&secret, c);
    let k = key("+15551234567").expect("a key");
    assert!(k.starts_with("patter-caller-"));
    assert_eq!(k.len(), "patter-caller-".len() + 16);
    assert_eq!(Some(k.clone()), key("+15551234567"));
    assert_eq!(Some(k.clone()), key("15551234567"));
    assert_ne!(Some(k.clone()), key("+15551234568"));
}

#[test]
fn no_caller_memory_without_a_number_or_a_secret() {
    let secret = "s".repeat(32);
    // Not a bare hash anyone can compute, and another deployment's secret gives another key.
    let bare = hex::encode(ring::digest::digest(&ring::digest::SHA256, b"+15551234567").as_ref());
    let k = caller_key(&secret, "+15551234567").expect("a key");
    assert_ne!(k, format!("patter-caller-{}", &bare[..16]));
    assert_ne!(Some(k), caller_key(&"t".repeat(32), "+15551234567"));
    for shared in [
        "browser",
        "anonymous",
        "sip:alice@example.com",
        "+266696687",
        "",
    ] {
        assert_eq!(caller_key(&secret, shared), None, "{shared}");
    }
    assert_eq!(caller_key("", "+15551234567"), None);
}

#[test]
fn session_id_is_safe() {
    assert_eq!(session_id("CA123"), "patter-call-CA123");
    assert_eq!(session_id("a/b:c..d"), "patter-call-a-b-c-.d");
    assert!(session_id(&"x".repeat(400)).len() <= 256);
}

#[test]
fn error_bodies() {
    assert_eq!(
        error_text(br#"{"error":{"message":"Invalid API key","type":"x"}}"#),
        "Invalid API key"
    );
    assert_eq!(
        error_text(br#"{"detail":{"status":"bad","message":"nope"}}"#),
        "nope"
    );
    assert_eq!(
        error_text(br#"{"detail":[{"msg":"field required"}]}"#),
        "field required"
    );
    assert_eq!(error_text(b"oops"), "oops");
    assert_eq!(error_text(b""), "(empty body)");
}
