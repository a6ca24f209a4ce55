// Draws the dashboard's charts from the JSON blocks the server rendered into the page.
(function () {
  function data(id) {
    const block = document.getElementById(id);
    return block ? JSON.parse(block.textContent) : null;
  }
  function hhmm(ts) {
    const d = new Date(ts);
    // 24-hour, as the tables print times
    return isNaN(d) ? String(ts) : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  }
  const colours = ["#3b7ddd", "#2f9e6e", "#d98e04", "#c2410c", "#7c3aed", "#0891b2", "#be185d"];

  // One line per series over shared time labels.
  function lines(canvasId, rows, timeKey, seriesKey, valueKey, yTitle, yMax) {
    const canvas = document.getElementById(canvasId);
    if (!canvas || !rows) return;
    const labels = [...new Set(rows.map((r) => r[timeKey]))];
    const series = [...new Set(rows.map((r) => r[seriesKey]))];
    const datasets = series.map((name, i) => ({
      label: name || "(none)",
      data: labels.map((t) => {
        const row = rows.find((r) => r[timeKey] === t && r[seriesKey] === name);
        return row ? row[valueKey] : null;
      }),
      borderColor: colours[i % colours.length],
      backgroundColor: colours[i % colours.length],
      spanGaps: true,
      tension: 0.2,
    }));
    new Chart(canvas, {
      type: "line",
      data: { labels: labels.map(hhmm), datasets },
      options: {
        animation: false,
        scales: { y: { beginAtZero: true, max: yMax, title: { display: true, text: yTitle } } },
      },
    });
  }

  // The A/B page: per canary, its test's path against the two thresholds, its pairs'
  // outcomes, and each arm's latency.
  function abCharts() {
    document.querySelectorAll("canvas.evalue-chart").forEach((canvas) => {
      const d = data(canvas.dataset.source);
      const pairs = d.path.map((p) => p.pairs);
      const flat = (v) => pairs.map(() => v);
      new Chart(canvas, {
        type: "line",
        data: {
          labels: pairs,
          datasets: [
            { label: "e-value (canary better)", data: d.path.map((p) => p.e_value), borderColor: colours[0], pointRadius: 0 },
            { label: "e-value (not better by delta)", data: d.path.map((p) => p.futility_e_value), borderColor: colours[3], pointRadius: 0 },
            { label: "promote at", data: flat(d.promote_at), borderColor: colours[1], borderDash: [6, 4], pointRadius: 0 },
            { label: "roll back at", data: flat(d.rollback_at), borderColor: colours[2], borderDash: [6, 4], pointRadius: 0 },
          ],
        },
        options: {
          animation: false,
          scales: {
            x: { title: { display: true, text: "pairs" } },
            y: { type: "logarithmic", title: { display: true, text: "e-value" } },
          },
        },
      });
    });
    document.querySelectorAll("canvas.outcomes-chart").forEach((canvas) => {
      const o = data(canvas.dataset.source).outcomes;
      new Chart(canvas, {
        type: "bar",
        data: {
          labels: ["wins", "ties", "losses"],
          datasets: [{ label: "pairs", data: [o.wins, o.ties, o.losses], backgroundColor: [colours[1], "#9ca3af", colours[3]] }],
        },
        options: { animation: false, plugins: { legend: { display: false } } },
      });
    });
    document.querySelectorAll("canvas.latency-chart").forEach((canvas) => {
      const l = data(canvas.dataset.source).latency;
      new Chart(canvas, {
        type: "bar",
        data: {
          labels: ["live", "canary"],
          datasets: [{ label: "median ms", data: [l.live, l.canary], backgroundColor: [colours[0], colours[2]] }],
        },
        options: { animation: false, plugins: { legend: { display: false } } },
      });
    });
  }

  // Buttons: each asks first, then posts JSON to /dashboard/act (the page's own origin and
  // Basic credentials; JSON only, so no other site can post it) and shows the page anew.
  function buttons() {
    document.querySelectorAll("button.act").forEach((b) =>
      b.addEventListener("click", async () => {
        if (!window.confirm(b.dataset.confirm)) return;
        b.disabled = true;
        const r = await fetch("/dashboard/act", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ action: b.dataset.action, lineage: b.dataset.lineage || null }),
        });
        const said = await r.json().catch(() => ({}));
        if (!r.ok) {
          window.alert((said.error && said.error.message) || r.statusText);
          b.disabled = false;
          return;
        }
        await update();
      })
    );
  }

  function draw() {
    lines("per-minute", data("per-minute-data"), "minute", "alias", "requests", "requests per minute");
    lines("reward-curve", data("reward-curve-data"), "bucket", "checkpoint", "reward", "mean reward", 1);
    abCharts();
    buttons();
  }

  // Live pages (overview, learning, A/B) fetch themselves again and swap their content in
  // place: no reload, no lost scroll position.
  async function update() {
    const r = await fetch(location.href, { headers: { Accept: "text/html" } });
    if (!r.ok) return;
    const fresh = new DOMParser().parseFromString(await r.text(), "text/html").querySelector("main");
    Object.values(Chart.instances).forEach((c) => c.destroy());
    document.querySelector("main").replaceWith(fresh);
    document.body.dataset.updated = String(Number(document.body.dataset.updated || 0) + 1);
    draw();
  }

  draw();
  const every = Number(document.body.dataset.refresh || 0);
  if (every) window.setInterval(update, every * 1000);
})();
