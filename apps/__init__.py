"""The Voila app behind `remat-explorer app`: a notebook that shows the Dashboard (installed
as `remat_explorer.apps`)."""
