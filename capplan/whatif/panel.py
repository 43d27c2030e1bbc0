"""The what-if panel: ipywidgets wired to :func:`~capplan.whatif.model.whatif_state`.

Every control has ``continuous_update=False`` and ``.observe(..., names="value")``; a change
recomputes the state and updates the plan table, the quarters and the chart in
place. What a person sees:

- **first paint at once**: :meth:`WhatIfPanel.start` shows a progress bar and what is being
  done (opening the study, reading cached statistics or fitting them) while the model loads,
  then swaps in the controls (in Voila, pre-heated kernels have done this before a visitor
  arrives);
- **never a stale plan**: when a position has no plan (e.g. a TTFT limit no tested rate
  meets), the table, quarters and chart are hidden and a message says in plain words what to
  change; moving a control back restores them;
- **round slider values** (TTFT 1 000 or 1 500 ms can be chosen; off the reduction's grid the
  envelope is fitted exactly, once, with a note while it reads);
- **save scenario**: the plan spec (YAML) and the finance workbook of what is on screen, as
  files in a folder and as download links;
- a layout that keeps every slider and its value readable from about 800 px wide (JupyterLab
  at 1280 px with the file browser open).

The chart is a :class:`capplan.viz.FigureArea` (plotly's mimetype in an Output widget;
``panel.figure`` is the figure on screen): a FigureWidget would send all of plotly.js through
the kernel to every page.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
import os
import traceback
from pathlib import Path

import plotly.graph_objects as go

from ..errors import CapplanError
from ..viz import FigureArea
from .model import (ATTAINMENT_CHOICES, CAPACITY_USES, POLICY_LABELS, NoCapacity, WhatIfModel,
                    WhatIfParams, WhatIfState, save_scenario, whatif_state)

_CSS = """<style>
.capplan-whatif td.value{text-align:right;font-variant-numeric:tabular-nums;padding:0 .6em}
.capplan-whatif th{text-align:left;font-weight:500;padding-right:1em}
.capplan-whatif .failed{color:#b00}
.capplan-q{border-collapse:collapse;font-size:.9em}
.capplan-q th,.capplan-q td{padding:.15em .45em;border-bottom:1px solid #ddd;text-align:right}
.capplan-q th:first-child,.capplan-q td:first-child{text-align:left}
.capplan-problem{background:#fff1f0;border-left:4px solid #c00;padding:.6em 1em;max-width:60em}
.capplan-busy{color:#555;font-style:italic}
</style>"""


def slider_range(value: float, lo_factor: float = 0.25, hi_factor: float = 3.0,
                  positions: int = 30) -> tuple[float, float, float]:
    """(min, max, step) around a default: a round step (1, 2, 2.5 or 5 × 10^k) of which the
    default is a multiple, so every position, the default included, is a round number."""
    span = value * (hi_factor - lo_factor)
    raw = span / positions
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    steps = [m * mag * 10 ** k for k in (-1, 0, 1) for m in (1, 2, 2.5, 5)]
    ok = [s for s in steps if abs(value / s - round(value / s)) < 1e-9 and span / s <= 4 * positions]
    step = min((s for s in ok if s >= raw), default=max(ok) if ok else min(steps))
    lo = max(step, math.floor(value * lo_factor / step) * step)
    hi = math.ceil(value * hi_factor / step) * step
    return float(f"{lo:.10g}"), float(f"{hi:.10g}"), float(f"{step:.10g}")


def table_html(table, plan=None) -> str:
    """HTML of the plan table; each row carries ``data-key`` so a browser test can read it."""
    e = html.escape
    rows = "\n".join(
        f'<tr data-key="{e(r.key)}"><th>{e(r.quantity)}</th>'
        f'<td class="value">{e(r.shown)}</td><td class="unit">{e(r.unit)}</td></tr>'
        for r in table.itertuples())
    failed = ""
    if plan is not None and not plan.ok:
        failed = "<ul class='failed'>" + "".join(
            f"<li>{e(c.sentence)}</li>" for c in plan.checks if not c.ok) + "</ul>"
    return f'{_CSS}<table class="capplan-whatif" id="plan-table">{rows}</table>{failed}'


def quarters_html(quarters) -> str:
    """The plan by quarter (dated), for the panel."""
    e = html.escape
    head = ("<tr><th>quarter</th><th>dates</th><th>peak (req/s)</th><th>planned (req/s)</th><th>groups</th>"
            "<th>GPUs (billed)</th><th>nodes</th><th>per month</th><th>per quarter</th>"
            "<th>per 1 000 good</th></tr>")
    rows = "".join(
        f'<tr data-quarter="{e(str(q.quarter))}"><td>{e(str(q.quarter))}</td>'
        f"<td>{q.start:%d %b %Y} – {q.end:%d %b %Y}</td><td>{q.peak_rps:.4g}</td><td>{q.demand_rps:.4g}</td>"
        f"<td>{q.groups}</td><td>{q.gpus} ({q.billed_gpus})</td><td>{q.nodes}</td>"
        f"<td>${q.cost_usd_per_month:,.0f}</td><td>${q.cost_usd_per_quarter:,.0f}</td>"
        f"<td>${q.cost_usd_per_1k_good_requests:,.2f}</td></tr>"
        for q in quarters.itertuples())
    return f'{_CSS}<table class="capplan-q" id="quarters-table">{head}{rows}</table>'


def problem_html(message: str) -> str:
    return f'{_CSS}<div class="capplan-problem" id="whatif-problem"><b>No plan.</b> {html.escape(message)}</div>'


def _download_link(path: Path, mime: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<a download="{html.escape(path.name)}" href="data:{mime};base64,{data}">'
            f"{html.escape(path.name)}</a>")


class WhatIfPanel:
    """The ipywidgets panel. ``panel.widget`` is what a notebook displays; controls are
    attributes (``panel.peak``, ``panel.ttft`` …) so a test can set ``.value`` headless."""

    def __init__(self, model: WhatIfModel, params: WhatIfParams | None = None, *, root=None):
        import ipywidgets as W

        self.model = model
        p = params or model.defaults()
        style = {"description_width": "150px"}
        layout = W.Layout(width="100%", max_width="460px")

        def fslider(desc, value, lo_f=0.25, hi_f=3.0):
            lo, hi, step = slider_range(value, lo_f, hi_f)
            # as many decimals as the step has (a step of 1 shows 8, of 0.25 shows 2.50)
            decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else 0
            fmt = f".{decimals + (1 if abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-9 else 0)}f"
            return W.FloatSlider(value=value, min=lo, max=hi, step=step, description=desc,
                                 continuous_update=False, readout_format=fmt, style=style, layout=layout)


        def limit_slider(desc, value, axis):
            """Round limits (1 000, 1 500, 2 000 ms …); each position is fitted exactly."""
            if not value:
                return None
            options = model.limit_choices(axis, value)
            if options is None:
                return fslider(desc, value)
            return W.SelectionSlider(options=[(f"{v:,.0f}" if v >= 100 else f"{v:g}", v) for v in options],
                                     value=value, description=desc, continuous_update=False, style=style,
                                     layout=layout)

        self.ttft = limit_slider("TTFT limit (ms)", p.ttft_ms, "x")
        self.tpot = limit_slider("TPOT limit (ms)", p.tpot_ms, "y")
        # a limit typed in a box applies on Enter or when the box loses focus; the hint says
        # the range a limit can take (the slider's ends)
        self.ttft_typed, ttft_row = self._typed_box("TTFT", self.ttft, style)
        self.tpot_typed, tpot_row = self._typed_box("TPOT", self.tpot, style)
        choices = sorted(set(ATTAINMENT_CHOICES) | {p.attainment})
        self.attainment = W.SelectionSlider(
            options=[(f"{a:.4g}", a) for a in choices], value=p.attainment,
            description="attainment target", continuous_update=False, style=style, layout=layout)
        self.peak = fslider("peak demand (req/s)", p.peak_rps, 0.1, 3.0)
        self.uncertainty = W.FloatSlider(value=p.uncertainty, min=0.0, max=1.0, step=0.05,
                                         description="demand uncertainty", continuous_update=False,
                                         readout_format=".0%", style=style, layout=layout)
        self.policy = W.Dropdown(options=[(v, k) for k, v in POLICY_LABELS.items()], value=p.policy,
                                 description="failure policy", style=style, layout=layout)
        price = p.price_usd_per_gpu_hour or 2.0
        self.price = fslider("$ per GPU-hour", price, 0.25, 3.0)
        self.capacity_use = W.ToggleButtons(options=[(v, k) for k, v in CAPACITY_USES.items()],
                                            value=p.capacity_use, description="plan on",
                                            style={"description_width": "150px", "button_width": "140px"})
        self.save = W.Button(description="Save scenario", icon="download",
                             tooltip="write the plan spec (YAML) and the finance workbook (XLSX)")
        self.saved = W.HTML()
        self.status = W.HTML()
        self.table = W.HTML()
        self.quarters = W.HTML()
        state = self._state(p)
        self.state = state
        # the fleet panel below has a chart of its own; ``chart`` is the widget the layout moves
        self.plot = FigureArea(state.figure if state is not None else None, css_class="capplan-plan-chart")
        self.chart = self.plot.widget
        self._show(state)
        self.controls = [c for c in (self.ttft, self.tpot, self.attainment, self.peak, self.uncertainty,
                                     self.policy, self.price, self.capacity_use) if c is not None]
        for c in self.controls:
            c.observe(self._on_change, names="value")
        self.save.on_click(self._on_save)
        shown = []
        for c in self.controls:
            shown.append(c)
            if c is self.ttft and ttft_row is not None:
                shown.append(ttft_row)
            if c is self.tpot and tpot_row is not None:
                shown.append(tpot_row)
        left = W.VBox(shown + [W.HBox([self.save]), self.saved],
                      layout=W.Layout(flex="0 1 470px", min_width="380px"))
        right = W.VBox([self.status, self.table], layout=W.Layout(flex="1 1 380px", min_width="320px"))
        self._top = [W.HBox([left, right], layout=W.Layout(flex_flow="row wrap", width="100%")),
                     W.HTML("<b>By quarter</b>"), self.quarters]
        self._below: list = []
        self.body = self._top + [self.chart]
        if root is not None:
            root.children = self.body
            self.widget = root
        else:
            self.widget = W.VBox(self.body)
        self._placed = True
        self._chart_shown = True
        if state is None:
            self._place_figure(False)

    def add_below(self, *widgets) -> None:
        """Put more widgets under the plan's chart, in the panel's own box: one display for
        the page, so the browser receives every widget with the first (a second display of
        its own was, in 2 of 4 Voila page loads, rendered before its model had arrived:
        "model not found")."""
        self._below = list(self._below) + list(widgets)
        self._place_figure(self._chart_shown)

    def _typed_box(self, name: str, slider, style):
        """A box to type the ``name`` limit into, under its slider, with the allowed range."""
        import ipywidgets as W

        if slider is None:
            return None, None
        lo, hi = self._limit_range(slider)
        box = W.FloatText(value=float(slider.value), description="or type (ms)", continuous_update=False,
                          style=style, layout=W.Layout(width="260px"))
        box.add_class(f"capplan-typed-{name.lower()}")
        hint = W.HTML(f"<small>{lo:,.0f}–{hi:,.0f} ms; Enter or Tab applies</small>")
        box.observe(lambda ch: self._on_typed(name, slider, box, ch["new"]), names="value")
        slider.observe(lambda ch: setattr(box, "value", float(ch["new"])), names="value")
        return box, W.HBox([box, hint], layout=W.Layout(align_items="center"))

    @staticmethod
    def _limit_range(slider) -> tuple[float, float]:
        if hasattr(slider, "options"):
            vals = [float(v) for _, v in slider.options]
            return min(vals), max(vals)
        return float(slider.min), float(slider.max)

    def _on_typed(self, name: str, slider, box, value) -> None:
        """A typed limit: inside the slider's range it becomes the slider's value (added to its
        positions when it is not one: the envelope is fitted exactly there); outside it, the
        panel says the range and keeps the plan on screen."""
        if getattr(self, "_quiet", False):
            return
        try:
            v = float(value)
        except (TypeError, ValueError):
            v = math.nan
        if math.isclose(v, float(slider.value), rel_tol=1e-12):
            return
        lo, hi = self._limit_range(slider)
        if not (math.isfinite(v) and lo <= v <= hi):
            self.status.value = (f"{_CSS}<span class='capplan-problem' id='whatif-typed-problem'>{name} limit "
                                 f"{value:g} ms is outside the range this study can answer, {lo:,.0f}–{hi:,.0f} "
                                 "ms: not applied.</span>")
            box.value = float(slider.value)
            return
        if hasattr(slider, "options") and all(not math.isclose(v, float(o)) for _, o in slider.options):
            opts = sorted([(lbl, float(o)) for lbl, o in slider.options] + [(f"{v:,.0f}" if v >= 100 else f"{v:g}", v)],
                          key=lambda lo_: lo_[1])
            self._quiet = True  # new options move the index: no re-plan for that intermediate value
            try:
                current = float(slider.value)
                slider.options = opts
                slider.value = current
            finally:
                self._quiet = False
        slider.value = next((float(o) for _, o in slider.options if math.isclose(v, float(o))), v) \
            if hasattr(slider, "options") else v

    # ------------------------------------------------------------------ starting
    @classmethod
    def start(cls, settings: dict, *, show: bool = True, cache=None):
        """Show the panel at once with a progress bar and what is being done (opening the study,
        reading the cached statistics or fitting them), then load the model and swap in the
        controls — in the same cell, so Voila's pre-heated kernels hand visitors a finished
        page, and JupyterLab shows the progress live. ``settings``: ``model_settings(...)``.
        Reduced statistics are kept on disk (``cache``; default: in the app, or when
        CAPPLAN_CACHE_DIR is set). A bad study or spec shows capplan's message, no traceback.
        Returns the panel (or, when loading failed, an object whose ``widget`` shows why)."""
        import ipywidgets as W
        from IPython.display import display

        if cache is None:
            cache = bool(os.environ.get("CAPPLAN_WHATIF_APP")) or bool(os.environ.get("CAPPLAN_CACHE_DIR"))
        bar = W.IntProgress(value=0, min=0, max=4, description="loading", layout=W.Layout(width="420px"))
        text = W.HTML("<span class='capplan-busy'>starting…</span>")
        root = W.VBox([W.HTML("<b>What-if panel</b> — loading the study"), bar, text])

        def progress(step, what):
            bar.value = step
            text.value = f"<span class='capplan-busy'>step {step} of 4: {html.escape(what)} …</span>"

        if show:
            display(root)
        try:
            model = WhatIfModel.build(**settings, cache=cache, progress=progress)
            progress(4, "drawing the plan")
            return cls(model, root=root)
        except CapplanError as exc:
            root.children = [W.HTML(problem_html(_plain(exc)))]
        except Exception as exc:  # noqa: BLE001 - a person reads this, not a traceback
            root.children = [W.HTML(problem_html(
                f"The panel could not start ({type(exc).__name__}: {exc}). Check the study and spec "
                "given to capplan whatif; the server log has the details."))]
            traceback.print_exc()

        class Failed:
            widget = root
            model = None

        return Failed()

    # ------------------------------------------------------------------ state
    def params(self) -> WhatIfParams:
        return WhatIfParams(
            ttft_ms=self.ttft.value if self.ttft else None,
            tpot_ms=self.tpot.value if self.tpot else None,
            attainment=float(self.attainment.value), peak_rps=float(self.peak.value),
            uncertainty=float(self.uncertainty.value), policy=self.policy.value,
            price_usd_per_gpu_hour=float(self.price.value),
            capacity_use=self.capacity_use.value)

    def _busy(self, what: str) -> None:
        self.status.value = f"{_CSS}<span class='capplan-busy'>{html.escape(what)} …</span>"

    def _state(self, params: WhatIfParams):
        try:
            return whatif_state(self.model, params, progress=self._busy)
        except NoCapacity as exc:
            self._problem(str(exc))
        except CapplanError as exc:
            self._problem(_plain(exc) + " Move the control back, or change another setting.")
        return None

    def _problem(self, message: str) -> None:
        """No plan for this position: hide the plan, say why and what to change."""
        self.status.value = problem_html(message)
        self.table.value = ""
        self.quarters.value = ""
        self._place_figure(False)
        self.stale = True

    def _place_figure(self, shown: bool) -> None:
        """Take the chart off the page while there is no plan (and put it back after); what
        ``add_below`` added stays under it."""
        if not getattr(self, "_placed", False):
            return
        self._chart_shown = shown
        self.widget.children = tuple(self._top + ([self.chart] if shown else []) + list(self._below))

    def _show(self, state: WhatIfState | None) -> None:
        if state is None:
            return
        slo = getattr(state.envelope, "slo", None)
        h = getattr(state.envelope, "honesty", None)  # as the report's index says it
        honesty = (f"<span id='whatif-honesty'>lower bound: {html.escape(h.status)}</span> · "
                   if h is not None else "")
        self.status.value = (f"<small>SLO: {html.escape(slo.describe() if slo else '')} · "
                             f"capacity: {html.escape(state.plan.capacity.source)} · {honesty}"
                             f"redrawn in {state.seconds * 1000:.0f} ms</small>")
        self.table.value = table_html(state.table, state.plan)
        self.quarters.value = quarters_html(state.quarters)
        self._place_figure(True)
        self.stale = False

    def _on_change(self, change) -> None:
        if getattr(self, "_quiet", False):
            return
        self.saved.value = ""
        state = self._state(self.params())
        if state is None:
            self.state = None
            return
        self.state = state
        self.plot.show(state.figure)
        self._show(state)

    @property
    def figure(self) -> go.Figure:
        """The figure on screen."""
        return self.plot.figure

    def _on_save(self, _button=None) -> Path | None:
        """Write the scenario on screen and offer it for download."""
        if self.state is None:
            self.saved.value = "<small>Nothing to save: these settings give no plan.</small>"
            return None
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        folder = Path(os.environ.get("CAPPLAN_SCENARIO_DIR") or Path.cwd() / "capplan-scenarios") / stamp
        try:
            paths = save_scenario(self.model, self.state, folder)
        except (OSError, CapplanError) as exc:
            self.saved.value = problem_html(f"Could not save the scenario: {exc}")
            return None
        xlsx_mime = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
        self.saved.value = (
            f"<small>Saved in <code>{html.escape(str(folder))}</code>: "
            f"{_download_link(paths['spec'], 'application/x-yaml')} · "
            f"{_download_link(paths['xlsx'], xlsx_mime)}. Same plan from the command line: "
            f"<code>capplan plan {html.escape(str(self.model.study.root))} --spec "
            f"{html.escape(str(paths['spec']))} --out plan-out/</code></small>")
        return folder


def _plain(exc: CapplanError) -> str:
    """A capplan error as one paragraph for the panel (the problem and its fix, no traceback)."""
    text = exc.format() if hasattr(exc, "format") else str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(ln.replace("ERROR: ", "").replace("fix:", "To fix it:") for ln in lines)
