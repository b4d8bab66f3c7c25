// Herald's live dashboard: Preact through htm (no build step), uPlot for
// the charts. Every data call sends the dashboard token as a bearer token;
// the token stays in this tab's sessionStorage.
import { html, render, useState, useEffect, useRef, useCallback } from '/dashboard/assets/htm-preact-standalone.module.js';

const API = '/dashboard/api';
const HISTORY = 300; // points per chart (5 minutes at one a second)
const CONSOLE_LINES = 200;

function api(token, path, init = {}) {
  return fetch(API + path, {
    ...init,
    headers: { ...(init.headers || {}), Authorization: `Bearer ${token}` },
  });
}

async function json(res) {
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new Error(body.error || `HTTP ${res.status}`);
  return body;
}

function Login({ onToken, error }) {
  const [value, setValue] = useState('');
  const submit = (e) => {
    e.preventDefault();
    onToken(value.trim());
  };
  return html`
    <form class="card login" id="login" onSubmit=${submit}>
      <h2>Herald dashboard</h2>
      <label for="token">Dashboard token</label>
      <input id="token" type="password" autocomplete="off" value=${value}
        onInput=${(e) => setValue(e.target.value)} />
      ${error && html`<p class="error" id="login-error">${error}</p>`}
      <button type="submit">Open</button>
    </form>`;
}

/** One uPlot chart, fed `data` ([times, ...series]). */
function Chart({ id, series, data }) {
  const el = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const width = Math.max(300, el.current.clientWidth);
    plot.current = new uPlot(
      {
        width,
        height: 180,
        series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2 }))],
        axes: [{}, { size: 50 }],
        scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      },
      data,
      el.current,
    );
    const resize = () => plot.current.setSize({ width: Math.max(300, el.current.clientWidth), height: 180 });
    window.addEventListener('resize', resize);
    return () => {
      window.removeEventListener('resize', resize);
      plot.current.destroy();
    };
  }, []);
  useEffect(() => {
    if (plot.current) plot.current.setData(data);
  }, [data]);
  return html`<div id=${id} ref=${el}></div>`;
}

/** Per-app history of the stats, with message rates from the counters. */
function useStats(token, onUnauthorized) {
  const [stats, setStats] = useState(null);
  const [error, setError] = useState(null);
  const history = useRef({});
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let stop = false;
    const poll = async () => {
      try {
        const res = await api(token, '/stats');
        if (res.status === 401) return onUnauthorized('The token was refused.');
        const s = await json(res);
        const t = s.time_ms / 1000;
        for (const app of s.apps) {
          const h = (history.current[app.id] ||= { t: [], conn: [], chan: [], sent: [], recv: [], last: null });
          const last = h.last;
          const dt = last ? Math.max(0.001, t - last.t) : 1;
          h.t.push(t);
          h.conn.push(app.connections);
          h.chan.push(app.channels);
          h.sent.push(last ? Math.max(0, (app.messages_sent - last.sent) / dt) : 0);
          h.recv.push(last ? Math.max(0, (app.messages_received - last.recv) / dt) : 0);
          h.last = { t, sent: app.messages_sent, recv: app.messages_received };
          for (const k of ['t', 'conn', 'chan', 'sent', 'recv']) if (h[k].length > HISTORY) h[k].shift();
        }
        setStats(s);
        setError(null);
        setTick((n) => n + 1);
      } catch (e) {
        setError(String(e.message || e));
      }
      if (!stop) setTimeout(poll, 1000);
    };
    poll();
    return () => {
      stop = true;
    };
  }, [token]);
  return { stats, error, history: history.current, tick };
}

function Channels({ token, app }) {
  const [list, setList] = useState([]);
  useEffect(() => {
    let stop = false;
    const poll = async () => {
      try {
        const body = await json(await api(token, `/apps/${encodeURIComponent(app)}/channels`));
        setList(body.channels);
      } catch {}
      if (!stop) setTimeout(poll, 2000);
    };
    poll();
    return () => {
      stop = true;
    };
  }, [token, app]);
  return html`
    <div class="card">
      <h2>Channels</h2>
      ${list.length === 0
        ? html`<p class="muted">No occupied channels.</p>`
        : html`<table id="channels">
            <thead><tr><th>Protocol</th><th>Channel</th><th class="num">Subscriptions</th><th class="num">Users</th></tr></thead>
            <tbody>
              ${list.map(
                (c) => html`<tr data-channel=${c.name} data-namespace=${c.namespace}>
                  <td class="muted">${c.namespace}</td><td>${c.name}</td><td class="num subs">${c.subscriptions}</td>
                  <td class="num">${c.name.startsWith('presence-') ? c.users : ''}</td>
                </tr>`,
              )}
            </tbody>
          </table>`}
    </div>`;
}

/** Read a server-sent event stream with fetch (EventSource cannot send the token). */
async function readEvents(token, app, signal, onEvent) {
  const res = await api(token, `/apps/${encodeURIComponent(app)}/events`, { signal });
  if (!res.ok || !res.body) throw new Error(`console: HTTP ${res.status}`);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      const data = block
        .split('\n')
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart())
        .join('\n');
      if (data) onEvent(JSON.parse(data));
    }
  }
}

function Console({ token, app }) {
  const [lines, setLines] = useState([]);
  const [paused, setPaused] = useState(false);
  const [status, setStatus] = useState('connecting');
  const pausedRef = useRef(false);
  pausedRef.current = paused;
  useEffect(() => {
    const ctl = new AbortController();
    let retry;
    const open = () => {
      setStatus('live');
      readEvents(token, app, ctl.signal, (ev) => {
        if (pausedRef.current) return;
        setLines((ls) => [ev, ...ls].slice(0, CONSOLE_LINES));
      })
        .catch(() => {})
        .finally(() => {
          if (!ctl.signal.aborted) {
            setStatus('reconnecting');
            retry = setTimeout(open, 2000);
          }
        });
    };
    open();
    return () => {
      ctl.abort();
      clearTimeout(retry);
    };
  }, [token, app]);
  // A channel labelled with its protocol's namespace (the same name in two
  // protocols is two channels).
  const where = (ev) => (ev.namespace ? `[${ev.namespace}] ${ev.channel}` : ev.channel);
  const describe = (ev) => {
    switch (ev.type) {
      case 'event':
        return `${where(ev)}  ${ev.event}  ${ev.data}${ev.user_id ? `  (user ${ev.user_id})` : ''}`;
      case 'member_added':
      case 'member_removed':
        return `${where(ev)}  user ${ev.user_id}`;
      case 'skipped':
        return `${ev.count} events skipped (the console fell behind)`;
      default:
        return where(ev);
    }
  };
  return html`
    <div class="card wide">
      <div class="row">
        <h2 style="flex:1">Debug console <span class="muted" id="console-status">${status}</span></h2>
        <button class="plain" onClick=${() => setPaused(!paused)}>${paused ? 'Resume' : 'Pause'}</button>
        <button class="plain" onClick=${() => setLines([])}>Clear</button>
      </div>
      <div id="console">
        ${lines.length === 0 && html`<p class="muted">Events of this app appear here as they pass.</p>`}
        ${lines.map(
          (ev) => html`<div class=${`event ${ev.type}`} data-type=${ev.type} data-channel=${ev.channel || ''}>
            <time>${new Date(ev.time_ms).toLocaleTimeString()}</time><span class="type">${ev.type}</span>${describe(ev)}
          </div>`,
        )}
      </div>
    </div>`;
}

function TestEvent({ token, app }) {
  const [channel, setChannel] = useState('');
  const [name, setName] = useState('test-event');
  const [data, setData] = useState('{"hello":"world"}');
  const [result, setResult] = useState(null);
  const send = async (e) => {
    e.preventDefault();
    try {
      await json(
        await api(token, `/apps/${encodeURIComponent(app)}/events`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ channel, name, data }),
        }),
      );
      setResult({ ok: true, text: `Sent ${name} to ${channel}.` });
    } catch (err) {
      setResult({ ok: false, text: String(err.message || err) });
    }
  };
  return html`
    <div class="card">
      <h2>Send a test event</h2>
      <form class="test" id="test-form" onSubmit=${send}>
        <input id="test-channel" placeholder="channel" value=${channel} onInput=${(e) => setChannel(e.target.value)} />
        <input id="test-event" placeholder="event name" value=${name} onInput=${(e) => setName(e.target.value)} />
        <textarea id="test-data" placeholder="data (a string; JSON is passed as text)" value=${data}
          onInput=${(e) => setData(e.target.value)}></textarea>
        <div class="row"><button id="test-send" type="submit">Send</button></div>
      </form>
      ${result && html`<p id="test-result" class=${result.ok ? 'muted' : 'error'}>${result.text}</p>`}
    </div>`;
}

function Dashboard({ token, onUnauthorized, onLogout }) {
  const { stats, error, history, tick } = useStats(token, onUnauthorized);
  const [app, setApp] = useState(null);
  useEffect(() => {
    if (stats && (!app || !stats.apps.some((a) => a.id === app))) setApp(stats.apps[0]?.id ?? null);
  }, [stats]);
  if (!stats || !app) return html`<p class="muted">${error || 'Loading…'}</p>`;
  const current = stats.apps.find((a) => a.id === app);
  const h = history[app];
  const data1 = [h.t, h.conn, h.chan];
  const data2 = [h.t, h.sent, h.recv];
  return html`
    <header>
      <h1>Herald</h1>
      <span class="muted">node ${stats.node} · broker ${stats.broker}</span>
      <span class="spacer"></span>
      <label>App <select id="app" value=${app} onChange=${(e) => setApp(e.target.value)}>
        ${stats.apps.map((a) => html`<option value=${a.id}>${a.id} (${a.source ?? 'file'}${a.enabled === false ? ', disabled' : ''})</option>`)}
      </select></label>
      <button class="plain" style="color:#fff;border-color:#fff" onClick=${onLogout}>Sign out</button>
    </header>
    ${error && html`<p class="error" style="padding:0 1.25rem">${error}</p>`}
    <main>
      <div class="card">
        <h2>Now</h2>
        <div class="figures">
          <div class="figure"><b id="connections">${current.connections}</b><span>connections</span></div>
          <div class="figure"><b id="channel-count">${current.channels}</b><span>channels</span></div>
          <div class="figure"><b id="subscriptions">${current.subscriptions}</b><span>subscriptions</span></div>
        </div>
        <${Chart} id="chart-connections" key=${app + '-1'} data=${data1} tick=${tick}
          series=${[{ label: 'connections', color: '#3b5bdb' }, { label: 'channels', color: '#2b8a3e' }]} />
      </div>
      <div class="card">
        <h2>Messages per second</h2>
        <${Chart} id="chart-messages" key=${app + '-2'} data=${data2} tick=${tick}
          series=${[{ label: 'sent', color: '#e8590c' }, { label: 'received', color: '#7048e8' }]} />
      </div>
      <${Channels} token=${token} app=${app} key=${app + '-c'} />
      <${TestEvent} token=${token} app=${app} key=${app + '-t'} />
      <${Console} token=${token} app=${app} key=${app + '-e'} />
    </main>`;
}

function App() {
  const [token, setToken] = useState(sessionStorage.getItem('herald-dashboard-token'));
  const [error, setError] = useState(null);
  const use = useCallback((t) => {
    sessionStorage.setItem('herald-dashboard-token', t);
    setError(null);
    setToken(t);
  }, []);
  const refuse = useCallback((why) => {
    sessionStorage.removeItem('herald-dashboard-token');
    setToken(null);
    setError(why);
  }, []);
  if (!token) return html`<${Login} onToken=${use} error=${error} />`;
  return html`<${Dashboard} token=${token} onUnauthorized=${refuse} onLogout=${() => refuse(null)} />`;
}

const root = document.getElementById('root');
root.textContent = '';
render(html`<${App} />`, root);
