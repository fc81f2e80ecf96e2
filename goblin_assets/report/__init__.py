"""The audit report: the report model, its markdown, HTML and chart renderings."""
