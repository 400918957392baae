"""`taehv-launch eval`: several TAEHV weight files measured side by side on the same held-out clips
(weights.py: what each file is and the model it loads into; measure.py: clips, metrics, the report)."""
