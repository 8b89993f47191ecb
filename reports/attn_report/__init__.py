"""attnbench reports: Google Benchmark results (and `attn verify --json`) into
an HTML report with embedded plots and a Markdown summary, and regression
tables between two runs. Pure functions over parsed JSON; report.py is the
thin command line over them."""
