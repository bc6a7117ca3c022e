//! Headless Chromium (Debian's `chromium`, which `cargo xtask test`
//! installs) for the pictures pipelock draws: a page is opened as a user
//! would open it, screenshotted, and what the browser's console said is
//! kept. The screenshot is then read back pixel by pixel, so "it renders"
//! means coloured boxes on the screen, not a file that parses.
use super::*;

/// Where the tests keep their screenshots (the manual's pictures are
/// copied from here).
pub(super) fn pictures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pictures")
}

/// What a page looked like.
pub(super) struct Shot {
    pub png: PathBuf,
    /// Share of the screenshot's pixels in a flame graph's colours: warm
    /// (red to yellow), not the background's pale gradient, white or text.
    pub warm_share: f64,
    /// The page's console lines (`console.log`, uncaught errors).
    pub console: Vec<String>,
    /// Every pixel, as red, green, blue.
    pub pixels: Vec<[u8; 3]>,
}

impl Shot {
    /// Share of the pixels `colour` says yes to.
    pub fn share(&self, colour: impl Fn([u8; 3]) -> bool) -> f64 {
        self.pixels.iter().filter(|p| colour(**p)).count() as f64 / self.pixels.len().max(1) as f64
    }
}

/// A pixel within `tolerance` of `want` in each channel.
pub(super) fn near(want: [u8; 3], tolerance: u8) -> impl Fn([u8; 3]) -> bool {
    move |p| p.iter().zip(want).all(|(a, b)| a.abs_diff(b) <= tolerance)
}

fn warm(r: u8, g: u8, b: u8) -> bool {
    r >= 200 && b <= 100 && g <= 235
}

/// Opens `page` in headless Chromium at `width`×`height` and screenshots
/// it into `png`. None when no chromium is installed.
pub(super) fn screenshot(page: &Path, png: &Path, width: u32, height: u32) -> Result<Option<Shot>> {
    let Some(chromium) = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
    else {
        return Ok(None);
    };
    fs::create_dir_all(png.parent().context("png path")?)?;
    let _ = fs::remove_file(png);
    let page = fs::canonicalize(page)?;
    // A browser that hangs fails the test instead of holding CI.
    let out = run(Command::new("timeout")
        .args(["60", chromium])
        .args([
            "--headless",
            // Root, in a container: the sandbox needs user namespaces.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", page.display())))?;
    ensure!(
        png.is_file(),
        "chromium wrote no screenshot: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    let console = text(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    let decoder = png::Decoder::new(std::io::BufReader::new(fs::File::open(png)?));
    let mut reader = decoder.read_info()?;
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels)?;
    let channels = info.color_type.samples();
    ensure!(channels >= 3, "a {:?} screenshot", info.color_type);
    let pixels = &pixels[..info.buffer_size()];
    let total = pixels.len() / channels;
    let warm_pixels = pixels
        .chunks_exact(channels)
        .filter(|p| warm(p[0], p[1], p[2]))
        .count();
    Ok(Some(Shot {
        png: png.to_owned(),
        warm_share: warm_pixels as f64 / total.max(1) as f64,
        console,
        pixels: pixels
            .chunks_exact(channels)
            .map(|p| [p[0], p[1], p[2]])
            .collect(),
    }))
}
