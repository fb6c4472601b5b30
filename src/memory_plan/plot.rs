//! The memory timeline of a [`MemoryPlan`] made with
//! [`plan_recording`](super::plan_recording): as JSON
//! ([`write_timeline`], `leangrad memory --timeline FILE.json`) and as a
//! plot ([`write_plot`], `--plot FILE.png` or `FILE.svg`).
//!
//! The plot has one panel per policy, lean on the left and what PyTorch's
//! autograd keeps on the right, on the same y axis: the live bytes after
//! each ledger event (x: the event's position in the step, counted from the
//! step's first event after setup), stacked by category, over shaded phases
//! (forward, backward, optimizer) with thin lines where one layer's events
//! give way to the next (named where the name fits), a line at each
//! panel's peak and, with [`write_plot_compared`], a dashed line at the
//! peak PyTorch itself measured for the same step.

use super::{MemoryPlan, StepInput, StepMemory, StepSpec, TorchMeasured};
use crate::memory::TimelineEvent;
use crate::memory::{human_bytes, replay, Category, CategoryBytes, PeakMoment, Phase};
use crate::{Error, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;
use std::path::Path;
use std::sync::OnceLock;

/// The family name the bundled font is registered under.
const FONT: &str = "sans-serif";
/// DejaVu Sans (see `assets/fonts/LICENSE-DejaVu.txt`): text is drawn with
/// it on every machine, without system font libraries.
static FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
/// Pixels of the PNG (and units of the SVG).
const SIZE: (u32, u32) = (1800, 760);

/// One policy's timeline in the JSON file.
#[derive(Serialize)]
struct PolicyTimeline<'a> {
    device: &'a str,
    peak_total: usize,
    at_peak: &'a PeakMoment,
    events: &'a [TimelineEvent],
}

/// The JSON file of `--timeline`.
#[derive(Serialize)]
struct TimelineFile<'a> {
    /// [`TIMELINE_FORMAT`]: how a later run knows the file is leangrad's.
    format: &'static str,
    model: &'a str,
    spec: &'a StepSpec,
    lean: PolicyTimeline<'a>,
    pytorch: PolicyTimeline<'a>,
}

fn events<'a>(step: &'a StepMemory, policy: &str) -> Result<&'a [TimelineEvent]> {
    step.timeline
        .as_deref()
        .ok_or_else(|| Error::InvalidArgument {
            op: "memory timeline",
            msg: format!("the {policy} step was run without recording its timeline"),
        })
}

impl MemoryPlan {
    /// Both steps' timelines as JSON: `format` ([`TIMELINE_FORMAT`]),
    /// `model`, `spec`, then `lean` and
    /// `pytorch`, each with its `device`, `peak_total`, `at_peak` and
    /// `events` (every [`TimelineEvent`] in order). An error if the plan
    /// was made without them.
    pub fn timeline_json(&self) -> Result<String> {
        fn policy<'a>(step: &'a StepMemory, name: &str) -> Result<PolicyTimeline<'a>> {
            Ok(PolicyTimeline {
                device: &step.report.device,
                peak_total: step.report.peak_total,
                at_peak: &step.report.at_peak,
                events: events(step, name)?,
            })
        }
        let file = TimelineFile {
            format: TIMELINE_FORMAT,
            model: &self.model,
            spec: &self.spec,
            lean: policy(&self.lean, "lean")?,
            pytorch: policy(&self.pytorch, "pytorch")?,
        };
        serde_json::to_string(&file).map_err(|e| Error::InvalidArgument {
            op: "memory timeline",
            msg: e.to_string(),
        })
    }
}

fn output_error(path: &Path, reason: impl ToString) -> Error {
    Error::OutputFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// The `format` a timeline file leangrad writes starts with.
pub const TIMELINE_FORMAT: &str = "leangrad-memory-timeline";
/// The comment every SVG plot leangrad writes starts with.
pub const SVG_MARKER: &str = "<!-- Software: leangrad -->";

/// The first bytes of `path` (at most `n`), or nothing when it cannot be read.
fn file_start(path: &Path, n: usize) -> Vec<u8> {
    use std::io::Read;
    let mut start = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.take(n as u64).read_to_end(&mut start);
    }
    start
}

/// Checks, touching nothing, that `leangrad memory --timeline` may write
/// `path`: it does not exist, or is a timeline leangrad wrote (it starts
/// with `{"format":"leangrad-memory-timeline"`). Anything else is
/// [`Error::OutputFile`] naming it: a user's file is never overwritten.
pub fn check_timeline_output(path: &Path) -> Result<()> {
    let start = format!("{{\"format\":\"{TIMELINE_FORMAT}\"");
    crate::data::check_outputs(
        [path.to_path_buf()],
        "--timeline",
        |p| file_start(p, start.len()) == start.as_bytes(),
        "a timeline leangrad writes starts with {\"format\":\"leangrad-memory-timeline\"",
    )
}

/// Checks, touching nothing, that [`write_plot`] may write `path`: a
/// `.png` or `.svg` name, and no file there unless leangrad wrote it (a PNG
/// with the `Software: leangrad` text chunk, an SVG starting with
/// [`SVG_MARKER`]). Anything else is [`Error::OutputFile`] naming it.
pub fn check_plot_output(path: &Path) -> Result<()> {
    if plot_is_svg(path)? {
        crate::data::check_outputs(
            [path.to_path_buf()],
            "--plot",
            |p| file_start(p, SVG_MARKER.len()) == SVG_MARKER.as_bytes(),
            "an SVG leangrad writes starts with the comment `<!-- Software: leangrad -->`",
        )
    } else {
        crate::data::check_png_outputs([path.to_path_buf()], "--plot")
    }
}

/// Whether a plot at `path` is an SVG (`.svg`) rather than a PNG (`.png`);
/// any other name is an error naming the file.
fn plot_is_svg(path: &Path) -> Result<bool> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("png") => Ok(false),
        Some("svg") => Ok(true),
        _ => Err(output_error(
            path,
            "a plot is written as PNG or SVG, named by the extension .png or .svg",
        )),
    }
}

/// Writes [`MemoryPlan::timeline_json`] to `path`, which must be new or a
/// timeline leangrad wrote ([`check_timeline_output`]).
pub fn write_timeline(plan: &MemoryPlan, path: &Path) -> Result<()> {
    check_timeline_output(path)?;
    let json = plan.timeline_json()?;
    std::fs::write(path, json + "\n").map_err(|e| output_error(path, e))
}

/// Draws both policies' timelines to `path`: a PNG for `.png`, an SVG for
/// `.svg` (any other extension is an error naming the file). An existing
/// file there is replaced only if leangrad wrote it ([`check_plot_output`]).
pub fn write_plot(plan: &MemoryPlan, path: &Path) -> Result<()> {
    write_plot_compared(plan, path, None)
}

/// [`write_plot`] with, when `torch` has a measured peak (`leangrad
/// memory --compare-torch` on a device where the step really ran), that
/// peak as a dashed line across both panels. `torch` must be of the
/// plan's step (the same batch).
pub fn write_plot_compared(
    plan: &MemoryPlan,
    path: &Path,
    torch: Option<&TorchMeasured>,
) -> Result<()> {
    check_plot_output(path)?;
    let svg = plot_is_svg(path)?;
    let panels = [
        Panel::new(&plan.lean, "lean (what leangrad keeps)", "lean")?,
        Panel::new(
            &plan.pytorch,
            "pytorch (what PyTorch's autograd keeps)",
            "pytorch",
        )?,
    ];
    register_font().map_err(|e| output_error(path, e))?;
    let title = title(plan);
    let torch = torch.and_then(|t| {
        t.peak_total
            .map(|peak| (peak, format!("PyTorch measured on {}", t.device)))
    });
    let torch = torch.as_ref().map(|(peak, name)| (*peak, name.as_str()));
    let (w, h) = SIZE;
    if svg {
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            draw(&root, &title, &panels, torch).map_err(|e| output_error(path, e))?;
            root.present().map_err(|e| output_error(path, e))?;
        }
        std::fs::write(path, format!("{SVG_MARKER}\n{text}")).map_err(|e| output_error(path, e))
    } else {
        let mut rgb = vec![0u8; w as usize * h as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
            draw(&root, &title, &panels, torch).map_err(|e| output_error(path, e))?;
            root.present().map_err(|e| output_error(path, e))?;
        }
        crate::data::write_rgb8_png(path, (w, h), &rgb).map_err(|e| match e {
            Error::Image { reason, .. } => output_error(path, reason),
            other => other,
        })
    }
}

fn register_font() -> std::result::Result<(), &'static str> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err("the bundled font could not be read")
    }
}

fn title(plan: &MemoryPlan) -> String {
    let s = &plan.spec;
    let input = match s.input {
        StepInput::Image { size, .. } => format!("{size}×{size}"),
        StepInput::Tokens { seq, .. } => format!("{seq} tokens"),
    };
    let how = if s.device == crate::Device::Meta {
        "predicted".to_string()
    } else {
        format!("measured on {}", s.device)
    };
    format!(
        "Memory over one training step: {}, batch {}, {input}, case {}, {}{} ({how})",
        plan.model,
        s.batch,
        s.case,
        super::report::optimizer_label(s.optimizer),
        if s.fused { " fused" } else { "" },
    )
}

/// One policy's data, ready to draw.
struct Panel {
    caption: String,
    /// Live bytes by category after each event.
    live: Vec<CategoryBytes>,
    /// (phase, first event, one past the last event).
    phases: Vec<(Phase, usize, usize)>,
    /// (layer, first event, one past the last event): the runs of events
    /// of one layer (see [`block`]); events outside any layer have none.
    layers: Vec<(String, usize, usize)>,
    peak: usize,
    /// The event that first reached the peak.
    peak_event: Option<usize>,
}

impl Panel {
    fn new(step: &StepMemory, name: &str, policy: &str) -> Result<Panel> {
        let events = events(step, policy)?;
        let mut phases: Vec<(Phase, usize, usize)> = Vec::new();
        let mut layers: Vec<(String, usize, usize)> = Vec::new();
        for (i, e) in events.iter().enumerate() {
            match phases.last_mut() {
                Some((p, _, end)) if *p == e.phase => *end = i + 1,
                _ => phases.push((e.phase, i, i + 1)),
            }
            let layer = block(e.scope.as_deref().unwrap_or_default());
            if e.phase == Phase::Setup || layer.is_empty() {
                continue;
            }
            match layers.last_mut() {
                // Events outside any layer between two of the same layer's
                // (a loss, a gradient's move) do not split it.
                Some((l, _, end)) if l == layer => *end = i + 1,
                _ => layers.push((layer.to_string(), i, i + 1)),
            }
        }
        let r = &step.report;
        Ok(Panel {
            caption: format!(
                "{name}: peak {} in {}",
                human_bytes(r.peak_total),
                r.at_peak.describe()
            ),
            live: replay(events),
            phases,
            layers,
            peak: r.peak_total,
            peak_event: events.iter().position(|e| e.live == r.peak_total),
        })
    }
}

/// The layer a scope belongs to, for the plot: its path up to its first
/// numbered part (`layer1.0.conv1` → `layer1.0`, `encoder.layer.3.attention`
/// → `encoder.layer.3`, `features.21` → `features.21`), or the whole path
/// when no part is a number (`conv1`, `fc`).
fn block(scope: &str) -> &str {
    let mut end = 0;
    for part in scope.split('.') {
        end += part.len();
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            return &scope[..end];
        }
        end += 1;
    }
    scope
}

fn color(c: Category) -> RGBColor {
    match c {
        Category::Parameter => RGBColor(140, 140, 140),
        Category::OptimizerState => RGBColor(148, 103, 189),
        Category::Activation => RGBColor(255, 152, 48),
        Category::Saved => RGBColor(214, 39, 40),
        Category::Workspace => RGBColor(188, 189, 34),
        Category::ParameterGradient => RGBColor(44, 160, 44),
        Category::InputGradient => RGBColor(23, 190, 207),
        Category::IntermediateGradient => RGBColor(31, 119, 180),
    }
}

fn phase_shade(p: Phase) -> RGBColor {
    match p {
        Phase::Setup => RGBColor(245, 245, 245),
        Phase::Forward => RGBColor(232, 240, 252),
        Phase::Backward => RGBColor(252, 238, 230),
        Phase::Optimizer => RGBColor(234, 248, 234),
    }
}

/// The unit of the y axis: the largest binary unit below `max` bytes.
fn unit(max: usize) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] = [
        (1024.0 * 1024.0 * 1024.0, "GiB"),
        (1024.0 * 1024.0, "MiB"),
        (1024.0, "KiB"),
        (1.0, "bytes"),
    ];
    UNITS
        .into_iter()
        .find(|(u, _)| max as f64 >= 2.0 * u)
        .unwrap_or((1.0, "bytes"))
}

type Drawn<DB> = std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// PyTorch's measured peak and what to call it.
type TorchPeak<'a> = Option<(usize, &'a str)>;

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    panels: &[Panel],
    torch: TorchPeak,
) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 30))?;
    let (_, height) = root.dim_in_pixel();
    let (charts, legend) = root.split_vertically(height.saturating_sub(44));
    let max = panels
        .iter()
        .map(|p| p.peak)
        .chain(torch.map(|(peak, _)| peak))
        .max()
        .unwrap_or(0)
        .max(1);
    let (scale, unit_name) = unit(max);
    // Room above the highest peak for its label, the layers' names and
    // the phases' names.
    let top = max as f64 / scale * 1.45;
    // Categories that hold bytes somewhere get an area and a legend entry.
    let shown: Vec<Category> = Category::ALL
        .into_iter()
        .filter(|&c| panels.iter().any(|p| p.live.iter().any(|b| b.get(c) > 0)))
        .collect();
    let areas = charts.split_evenly((1, panels.len()));
    for (i, (panel, area)) in panels.iter().zip(areas.iter()).enumerate() {
        draw_panel(area, panel, &shown, (scale, unit_name, top), i == 0, torch)?;
    }
    draw_legend(&legend, &shown, torch.is_some())
}

/// One policy's panel: phases, layers, the stacked categories, the peak
/// and PyTorch's measured peak; `(scale, unit, top)` the y axis shared by
/// the panels.
fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    shown: &[Category],
    (scale, unit_name, top): (f64, &str, f64),
    first_panel: bool,
    torch: TorchPeak,
) -> Drawn<DB> {
    let n = panel.live.len().max(2);
    // Setup (building the model) is left out: its bytes are the base the
    // step starts from. The x axis counts the step's events from its
    // first, 0 (the JSON keeps every event's number from the ledger's
    // start).
    let first = panel
        .phases
        .iter()
        .find(|(p, _, _)| *p != Phase::Setup)
        .map_or(0, |&(_, start, _)| start)
        .min(n - 1);
    let x = |event: usize| event.saturating_sub(first) as f64;
    let span = x(n);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.caption, (FONT, 18))
        .margin(14)
        .x_label_area_size(56)
        .y_label_area_size(if first_panel { 84 } else { 60 })
        .build_cartesian_2d(0f64..span, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(RGBColor(232, 232, 232))
        .x_desc("event of the step (allocation, free or change of category), from its first")
        .y_desc(format!("live memory ({unit_name})"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .axis_desc_style((FONT, 17))
        .label_style((FONT, 15))
        .draw()?;
    let plot_width = chart.plotting_area().dim_in_pixel().0 as f64;
    // Pixels per event, to tell whether a name fits its band.
    let px = plot_width / span;
    for &(phase, start, end) in panel.phases.iter().filter(|p| p.0 != Phase::Setup) {
        chart.draw_series([Rectangle::new(
            [(x(start), 0.0), (x(end), top)],
            phase_shade(phase).filled(),
        )])?;
        // A name only where it fits (a phase can be a sliver).
        if (end - start) as f64 * px > 80.0 {
            chart.draw_series([Text::new(
                phase.name(),
                (x(start) + 6.0 / px, top * 0.985),
                (FONT, 16).into_font().color(&RGBColor(90, 90, 90)),
            )])?;
        }
    }
    draw_layers(&mut chart, panel, first, (top, px))?;
    // Stacked: the sum of every shown category up to `c`, drawn from the
    // top category down so each lower one covers the rest. Each value
    // holds from its event to the next: a step, not a slope.
    for (k, &c) in shown.iter().enumerate().rev() {
        let points = panel
            .live
            .iter()
            .enumerate()
            .skip(first)
            .flat_map(|(i, b)| {
                let y = shown[..=k].iter().map(|&d| b.get(d)).sum::<usize>() as f64 / scale;
                [(x(i), y), (x(i) + 1.0, y)]
            });
        chart.draw_series(AreaSeries::new(points, 0.0, color(c).filled()))?;
    }
    let peak = panel.peak as f64 / scale;
    chart.draw_series(LineSeries::new(
        [(0.0, peak), (span, peak)],
        BLACK.stroke_width(1),
    ))?;
    if let Some(i) = panel.peak_event {
        chart.draw_series([Circle::new((x(i) + 0.5, peak), 5, BLACK.filled())])?;
    }
    chart.draw_series([Text::new(
        format!("peak {}", human_bytes(panel.peak)),
        (6.0 / px, peak + top * 0.01),
        (FONT, 16)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Bottom)),
    )])?;
    if let Some((bytes, name)) = torch {
        let y = bytes as f64 / scale;
        chart.draw_series(DashedLineSeries::new(
            [(0.0, y), (span, y)],
            8,
            5,
            TORCH.stroke_width(2),
        ))?;
        chart.draw_series([Text::new(
            format!("{name}: peak {}", human_bytes(bytes)),
            (span - 6.0 / px, y + top * 0.01),
            (FONT, 15)
                .into_font()
                .color(&TORCH)
                .pos(Pos::new(HPos::Right, VPos::Bottom)),
        )])?;
    }
    Ok(())
}

/// The colour of PyTorch's measured peak.
const TORCH: RGBColor = RGBColor(200, 30, 120);

/// Thin lines where one layer's events give way to the next, and each
/// layer's name, written downwards beside its line where the band is wide
/// enough for the text's height; events are counted from `first`, `px`
/// pixels each.
fn draw_layers<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    panel: &Panel,
    first: usize,
    (top, px): (f64, f64),
) -> Drawn<DB> {
    let line = RGBColor(160, 160, 160).stroke_width(1);
    let font = (FONT, 13)
        .into_font()
        .transform(FontTransform::Rotate90)
        .color(&RGBColor(50, 50, 50));
    for (name, start, end) in &panel.layers {
        let x = start.saturating_sub(first) as f64;
        chart.draw_series(LineSeries::new([(x, 0.0), (x, top * 0.955)], line))?;
        // The text runs down the band: it needs its height (13 pixels) of
        // the band's width.
        if (end - start) as f64 * px >= 16.0 {
            chart.draw_series([Text::new(
                name.clone(),
                (x + 15.0 / px, top * 0.95),
                font.clone(),
            )])?;
        }
    }
    Ok(())
}

/// One row of swatches and names, centred in `area`; `torch` adds the
/// dashed line of PyTorch's measured peak.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    shown: &[Category],
    torch: bool,
) -> Drawn<DB> {
    let font = TextStyle::from((FONT, 17).into_font()).color(&BLACK);
    let (swatch, gap) = (16i32, 28i32);
    let mut entries: Vec<(&str, RGBColor)> = shown.iter().map(|&c| (c.label(), color(c))).collect();
    if torch {
        entries.push(("PyTorch's measured peak", TORCH));
    }
    let widths: Vec<i32> = entries
        .iter()
        .map(|(label, _)| {
            let (w, _) = area.estimate_text_size(label, &font).unwrap_or((100, 0));
            swatch + 6 + w as i32
        })
        .collect();
    let total: i32 = widths.iter().sum::<i32>() + gap * (entries.len() as i32 - 1).max(0);
    let (width, _) = area.dim_in_pixel();
    let mut x = (width as i32 - total).max(0) / 2;
    let y = 12;
    for ((label, c), w) in entries.iter().zip(widths) {
        area.draw(&Rectangle::new(
            [(x, y), (x + swatch, y + swatch)],
            c.filled(),
        ))?;
        area.draw_text(label, &font, (x + swatch + 6, y))?;
        x += w + gap;
    }
    Ok(())
}
