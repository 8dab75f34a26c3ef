"""What a placement costs besides its grams: missing carbon data, the tail past the forecast,
the run-now counterfactual, lateness, deferral, power caps, ramp limits, feasibility."""
