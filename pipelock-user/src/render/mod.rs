//! Views of the model as text tables, CSV, terminal histograms, flame
//! graphs and HTML pages (JSON is the model's own serde form). Pure functions of model
//! values.
pub mod callers;
pub mod csv;
pub mod flame;
pub mod header;
pub mod histogram;
pub mod html;
pub mod judge;
pub mod metrics;
pub mod owners;
pub mod text;

pub use self::{
    csv::{CSV_COLUMNS, csv_block, to_csv},
    histogram::{render_histogram, render_histogram_width, render_histograms},
    owners::render_owners,
    text::render,
};
