"""Drives patterd's MCP server with the official Python `mcp` client (the one Hermes uses).

Usage:
  client.py http URL TOKEN        Streamable HTTP at URL (e.g. http://127.0.0.1:8080/mcp)
  client.py stdio EXE URL TOKEN   `EXE mcp --stdio --url URL --token TOKEN`

Runs one scenario and prints one JSON line per step on stdout; exits non-zero on the first
failed check. The Rust test (tests/control/mcp.rs) answers the calls this places through the Twilio
simulator: calls to +15557654321 are answered, talked to and hung up by the caller; calls to
+15557654322 are answered and kept live until end_call.
"""

import asyncio
import json
import sys
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

TOOLS = {"make_call", "call_third_party", "get_calls", "get_transcript", "end_call",
         "transfer_call", "send_dtmf", "say",
         "get_metrics", "configure_inbound", "send_sms", "lookup_number"}


def step(name, **fields):
    print(json.dumps({"step": name, **fields}), flush=True)


def check(cond, what):
    if not cond:
        step("failed", what=what)
        raise SystemExit(f"check failed: {what}")


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def scenario(session):
    init = await session.initialize()
    step("initialize", server=init.serverInfo.name, version=init.serverInfo.version,
         protocol=init.protocolVersion)
    check(init.serverInfo.name == "patterd", "serverInfo.name is patterd")
    check(init.capabilities.tools is not None and init.capabilities.resources is not None,
          "tools and resources capabilities")

    tools = (await session.list_tools()).tools
    names = {t.name for t in tools}
    step("tools", names=sorted(names))
    check(names == TOOLS, "exactly the twelve tools")
    by_name = {t.name: t for t in tools}
    check(by_name["make_call"].inputSchema["required"] == ["to", "systemPrompt"],
          "make_call requires to and systemPrompt")
    check("machineDetection" in by_name["make_call"].inputSchema["properties"],
          "make_call has camelCase machineDetection")
    check(by_name["get_transcript"].inputSchema["required"] == ["callId"], "callId argument")
    for t in tools:
        check(t.inputSchema.get("type") == "object", f"{t.name} has an object schema")

    # A disallowed destination is an isError result, not a protocol error.
    bad = await session.call_tool("make_call", {"to": "+442071234567", "systemPrompt": "x"})
    step("disallowed", is_error=bad.isError, text=text_of(bad))
    check(bad.isError is True, "disallowed destination is isError")
    check("allowed_destinations" in text_of(bad), "the refusal says what to change")

    # make_call, waiting: the simulated callee answers, talks and hangs up.
    done = await session.call_tool("make_call", {
        "to": "+15557654321", "systemPrompt": "You are calling to confirm an appointment.",
        "firstMessage": "Hi, this is the clinic."})
    text = text_of(done)
    step("make_call", is_error=done.isError, text=text)
    check(not done.isError, "make_call succeeded")
    check(text.startswith("Call to +15557654321 completed."), "make_call headline")
    check("Outcome: answered" in text and "Status: completed" in text, "outcome and status")
    check("[user] yes that works" in text, "caller's words in the transcript")
    check("[assistant] Hi, this is the clinic." in text, "greeting in the transcript")
    call_id = next(line.split(": ", 1)[1] for line in text.splitlines()
                   if line.startswith("Call ID: "))

    tr = await session.call_tool("get_transcript", {"callId": call_id})
    step("get_transcript", is_error=tr.isError, text=text_of(tr))
    check(not tr.isError and "---" in text_of(tr) and "[user] yes that works" in text_of(tr),
          "get_transcript layout")
    missing = await session.call_tool("get_transcript", {"callId": "CAnothere"})
    check(missing.isError is True and "not found" in text_of(missing), "unknown call id")

    calls = await session.call_tool("get_calls", {})
    step("get_calls", text=text_of(calls))
    check(f"OUT | completed | {call_id}" in text_of(calls), "get_calls line")

    # A live call ended with end_call.
    placed = await session.call_tool("make_call", {
        "to": "+15557654322", "systemPrompt": "Wait.", "wait": False})
    check(not placed.isError, "make_call wait:false")
    live_id = next(line.split(": ", 1)[1] for line in text_of(placed).splitlines()
                   if line.startswith("Call ID: "))
    for _ in range(200):
        listed = text_of(await session.call_tool("get_calls", {}))
        if f"OUT | in-progress | {live_id}" in listed:
            break
        await asyncio.sleep(0.05)
    else:
        check(False, "the second call became in-progress")
    ended = await session.call_tool("end_call", {"callId": live_id})
    step("end_call", is_error=ended.isError, text=text_of(ended))
    check(not ended.isError and text_of(ended).startswith(f"Call {live_id} ended."), "end_call")
    again = await session.call_tool("end_call", {"callId": live_id})
    check(again.isError is True, "end_call on an ended call is isError")

    metrics = await session.call_tool("get_metrics", {"callId": call_id})
    check(not metrics.isError and "Response latency ms" in text_of(metrics), "get_metrics")

    resources = await session.list_resources()
    check([str(r.uri) for r in resources.resources] == ["patter://dashboard"], "dashboard listed")
    templates = await session.list_resource_templates()
    check([t.uriTemplate for t in templates.resourceTemplates] == ["patter://call/{callId}"],
          "call template listed")
    dash = await session.read_resource("patter://dashboard")
    check(call_id in dash.contents[0].text, "dashboard lists the call")
    detail = await session.read_resource(f"patter://call/{call_id}")
    check("yes that works" in detail.contents[0].text, "call resource has the transcript")
    step("done")


async def main():
    mode = sys.argv[1]
    timeout = timedelta(seconds=120)
    if mode == "http":
        url, token = sys.argv[2], sys.argv[3]
        async with streamablehttp_client(url, headers={"Authorization": f"Bearer {token}"},
                                         timeout=30, sse_read_timeout=900) as (r, w, _):
            async with ClientSession(r, w, read_timeout_seconds=timeout) as session:
                await scenario(session)
    else:
        exe, url, token = sys.argv[2], sys.argv[3], sys.argv[4]
        params = StdioServerParameters(
            command=exe, args=["mcp", "--stdio", "--url", url, "--token", token])
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w, read_timeout_seconds=timeout) as session:
                await scenario(session)


if __name__ == "__main__":
    asyncio.run(main())
