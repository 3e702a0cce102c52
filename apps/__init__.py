"""The Voila app behind `remat-explorer app`: a notebook that shows `widgets.Dashboard`."""
