// Reads an OpenAI-style server-sent-event body: calls onEvent(json) for each
// `data: {...}` event, in order, as it arrives (`data: [DONE]` and comments skipped).
export async function forEachEvent(body, onEvent) {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of body) {
    buf += dec.decode(chunk, { stream: true });
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      if (ev.startsWith("data: {")) onEvent(JSON.parse(ev.slice(6)));
    }
  }
}

// GET URL/metrics (Prometheus text) as { "name{labels}": value }.
export async function scrapeMetrics(url) {
  const m = {};
  for (const line of (await (await fetch(`${url}/metrics`)).text()).split("\n"))
    if (line && !line.startsWith("#")) m[line.slice(0, line.lastIndexOf(" "))] = Number(line.slice(line.lastIndexOf(" ") + 1));
  return m;
}
