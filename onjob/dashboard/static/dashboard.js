// Draws the dashboard's charts from the JSON blocks the server rendered into the page.
(function () {
  function data(id) {
    const block = document.getElementById(id);
    return block ? JSON.parse(block.textContent) : null;
  }
  function hhmm(ts) {
    const d = new Date(ts);
    return isNaN(d) ? String(ts) : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
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

  lines("per-minute", data("per-minute-data"), "minute", "alias", "requests", "requests per minute");
  lines("reward-curve", data("reward-curve-data"), "bucket", "checkpoint", "reward", "mean reward", 1);
})();
