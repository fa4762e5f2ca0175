//! A client of patterd's REST API (`/v1`) for tests: JSON in, `(status, JSON)` out, with an
//! optional bearer token.

use serde_json::Value;

use super::Stack;

pub struct Api {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    pub fn new(stack: &Stack, token: Option<&str>) -> Self {
        Self {
            client: reqwest::Client::new(),
            base: stack.base.clone(),
            token: token.map(str::to_string),
        }
    }

    /// A client that sends the stack's bearer token (`[server] api_token`).
    pub fn authed(stack: &Stack) -> Self {
        Self::new(stack, Some(&stack.api_token))
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("API request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }
}
