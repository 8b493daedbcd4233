// prime-runs-otel viewer: a run's curves, drawn with uPlot (vendored, see
// VENDORED.md) from the numbers at the address in data-charts (JSON, each
// series already reduced on the server). Each chart shows the value under the
// pointer (its legend), zooms on a dragged range (double-click: all of it),
// and the controls above them smooth every curve, put the y axis on a log
// scale, and switch the x axis between step (or episode) and time.
"use strict";

(function () {
  const PALETTE = ["#2f6fde", "#e0892b", "#2c9c69", "#c1447b", "#7a5bd1", "#7d7d7d"];
  const settings = { smoothing: 0, log: false, x: "step" };
  // Steps and episode numbers are whole: ticks only on whole numbers.
  const WHOLE = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4,
    2.5e4, 5e4, 1e5, 2e5, 2.5e5, 5e5, 1e6, 2e6, 2.5e6, 5e6, 1e7];
  let plots = [];

  function smooth(values, weight) {
    if (!weight) return values;
    let last = null;
    return values.map(function (value) {
      if (value === null || value === undefined) return null;
      last = last === null ? value : last * weight + value * (1 - weight);
      return last;
    });
  }

  function fixed(value) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    const size = Math.abs(value);
    if (size !== 0 && (size >= 1e5 || size < 1e-3)) return value.toExponential(3);
    return String(Number(value.toPrecision(6)));
  }

  function data(chart, byTime) {
    const x = byTime ? chart.time : chart.x;
    let order = x.map(function (_, index) { return index; });
    if (byTime) order.sort(function (a, b) { return x[a] - x[b]; });
    const columns = [order.map(function (index) { return x[index]; })];
    for (const series of chart.series) {
      let values = order.map(function (index) { return series.values[index]; });
      values = smooth(values, settings.smoothing);
      if (settings.log) values = values.map(function (v) { return v !== null && v > 0 ? v : null; });
      columns.push(values);
    }
    return columns;
  }

  function draw(figure, chart, axisName, width) {
    const byTime = settings.x === "time" && chart.time !== null;
    const options = {
      width: width,
      height: 220,
      legend: { live: true },
      cursor: { sync: { key: "run" }, drag: { x: true, y: false } },
      scales: {
        x: { time: byTime },
        y: { distr: settings.log ? 3 : 1 },
      },
      axes: [
        byTime ? { label: "time", size: 44 } : { label: axisName, size: 44, incrs: WHOLE },
        { size: 70, values: function (_, ticks) { return ticks.map(fixed); } },
      ],
      series: [{ label: byTime ? "time" : axisName, value: byTime ? undefined : function (_, v) { return fixed(v); } }].concat(
        chart.series.map(function (series, index) {
          return {
            label: series.label,
            stroke: PALETTE[index % PALETTE.length],
            width: 1.5,
            spanGaps: false,
            points: { show: chart.x.length < 60 },
            value: function (_, v) { return fixed(v); },
          };
        })
      ),
    };
    return new uPlot(options, data(chart, byTime), figure);
  }

  function controls(section, anyTime, axisName, redraw) {
    const bar = document.createElement("form");
    bar.className = "chart-controls";
    bar.innerHTML =
      '<label>smoothing <input type="range" name="smoothing" min="0" max="0.99" step="0.01" value="0"></label> ' +
      '<output name="shown">0</output> ' +
      '<label><input type="checkbox" name="log"> log scale</label> ' +
      '<label>x axis <select name="x"><option value="step"></option>' +
      '<option value="time">time</option></select></label> ' +
      '<span class="hint">drag across a chart to zoom; double-click for all of it</span>';
    bar.querySelector('option[value="step"]').textContent = axisName;
    if (!anyTime) bar.querySelector('option[value="time"]').disabled = true;
    bar.addEventListener("input", function () {
      settings.smoothing = Number(bar.elements.smoothing.value);
      bar.elements.shown.value = settings.smoothing.toFixed(2);
      settings.log = bar.elements.log.checked;
      settings.x = bar.elements.x.value;
      redraw();
    });
    bar.addEventListener("submit", function (event) { event.preventDefault(); });
    section.insertBefore(bar, section.firstChild);
  }

  async function start() {
    const holder = document.querySelector(".curves[data-charts]");
    if (!holder || typeof uPlot === "undefined") return;
    const answer = await fetch(holder.dataset.charts, { headers: { Accept: "application/json" } });
    if (!answer.ok) throw new Error("charts: status " + answer.status);
    const found = await answer.json();
    const axisName = holder.dataset.axis;
    const figures = found.charts.map(function (chart) {
      const figure = document.createElement("figure");
      figure.className = "curve";
      figure.dataset.chart = chart.title;
      const caption = document.createElement("figcaption");
      caption.textContent = chart.title;
      figure.appendChild(caption);
      holder.appendChild(figure);
      return { figure: figure, chart: chart };
    });

    function redraw() {
      for (const plot of plots) plot.destroy();
      // Two charts a row where there is room for both, else one as wide as the page.
      const columns = holder.clientWidth >= 900 ? 2 : 1;
      const width = Math.max(260, Math.floor((holder.clientWidth - 32 * (columns - 1)) / columns) - 8);
      plots = figures.map(function (item) { return draw(item.figure, item.chart, axisName, width); });
      holder.dataset.drawn = String(plots.length);
      holder.plots = plots; // for whoever inspects the page (the browser tests)
    }

    if (!holder.querySelector(".chart-controls")) {
      controls(holder, found.charts.some(function (chart) { return chart.time !== null; }), axisName, redraw);
    }
    redraw();
    let waiting = null;
    window.addEventListener("resize", function () {
      window.clearTimeout(waiting);
      waiting = window.setTimeout(redraw, 150);
    });
  }

  function run() {
    plots = [];
    start().catch(function (error) {
      const status = document.getElementById("live-status");
      if (status) status.textContent = "the curves could not be drawn: " + error.message;
      console.warn(error);
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
  document.addEventListener("viewer:redrawn", run);
})();
