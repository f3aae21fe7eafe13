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

/// Value parser of a tolerance strictly between 0 and 1 (`graph gap --epsilon`, `graph mix
/// --epsilon`): 0 asks for exact mixing, which no graph but the complete one reaches (the gap
/// command printed 18446744073709551615 rounds), and 1 or more is reached before any round.
pub fn open_unit_interval(s: &str) -> Result<f64, String> {
    let v = finite_f64(s)?;
    if v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(format!("must be a number strictly between 0 and 1 (e.g. 1e-3), got {s}"))
    }
}

/// Value parser of an amount that must be positive and finite (`bench --seconds`, `--dilation`).
pub fn positive_f64(s: &str) -> Result<f64, String> {
    let v = finite_f64(s)?;
    if v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a positive number, got {s}"))
    }
}

/// Value parser of a count that must be at least 1 (`bench --batch-size`, `--hidden`).
pub fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if v >= 1 => Ok(v),
        Ok(_) => Err("must be at least 1, got 0".into()),
        Err(_) => Err(format!("expected a whole number of at least 1, got {s:?}")),
    }
}

/// The defaults of a clap option group (a mode's or a model's options), from the same attributes that define
/// its flags, so a default is written once.
pub fn option_defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let cmd = T::augment_args(clap::Command::new("defaults").no_binary_name(true));
    let m = cmd.try_get_matches_from(std::iter::empty::<String>()).expect("every option has a default or is optional");
    T::from_arg_matches(&m).expect("defaults build the options")
}
