"""Carbon accounting: per-job receipts, fleet reports and the energy disclosure export.

Everything here starts from what was *measured*: a job's energy (`jobs.energy_j`, by the
GPU energy counter or the integral of sampled power, see `telemetry.energy`) and the
*recorded* grid intensity of the zone it ran in (`carbon_intensity` actuals, see
`scheduler.carbon`). A job's carbon is

    gCO2 = sum over the run's pieces of  energy_piece_kWh x intensity(zone, piece) x PUE

where the run is cut wherever the intensity changes, and each piece's energy comes from the
GPUs' own power samples (raw samples, else their minute means, read by `scheduler.samples`),
scaled so the pieces add up to the measured energy. Without samples the energy is spread
evenly over time, which is energy x the time-weighted mean intensity. A piece without a
recorded value is a gap: it is priced at the zone's static yearly mean where there is one
(average signal only; basis "mixed" or "static") and never at zero; with no value at all the
job's gCO2 stays unknown (NULL). Jobs priced with anything but actuals are re-priced by
`Ledger.backfill` while actuals may still arrive (`recheck_days`), because carbon data often
lands after a job ends.

The average and marginal signals are never mixed: a job is priced with its zone's signal
(`CarbonSignals.signal_of`), which the receipt names.

Reports and exports aggregate in SQL (GROUP BY over the indexed `jobs.ended_at`), so a year
of a busy fleet answers in well under a second; see bench/report_bench.py.

The modules, one job each:

    run_carbon.py   the pure part: one run's carbon over intensity spans (RunCarbon)
    ledger.py       pricing finished jobs from the store and recording it (Ledger; its SQL on
                    jobs is `scheduler.jobs.pricing`)
    receipts.py     one job's receipt (build_receipt, Receipts)
    embodied.py     embodied carbon from the catalog: the receipt's part, the rates the sums
                    price GPU-seconds with, the SCI-style total per prompt; always beside the
                    operational grams, never added into them
    aggregate.py    the sums over a period that reports and the export share (JobSums,
                    over `scheduler.jobs.sums`), and the figures made of them
    reports.py      fleet reports by user, workload, model, zone, day or node (Reports)
    export.py       the energy and emissions disclosure (Disclosure)
    accountant.py   all of it over one store, for the daemon, the API and the CLI (Accountant)
    config.py · measurement.py · figures.py   the [accounting] section, energy methods in
                    words, the shared units and definitions
"""
