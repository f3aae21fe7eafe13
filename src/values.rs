//! Value parsers shared by the option groups of every layer (a mode's or a model's options are
//! declared in its own file, below the configuration): a non-finite number is refused where it
//! is parsed, for flags and configuration files alike.

/// Value parser of every `f64` option, flags and config files alike: a number that is neither NaN
/// nor infinite. No option means either, and JSON (the merge, the run identity) cannot carry them.
pub fn finite_f64(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("expected a number, got {s:?}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("must be a finite number, got {s}"))
    }
}

/// [`finite_f64`] for `f32` options (parsed as f32 directly: going through f64 could round twice).
pub fn finite_f32(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("expected a number, got {s:?}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("must be a finite number (of 32 bits), got {s}"))
    }
}
