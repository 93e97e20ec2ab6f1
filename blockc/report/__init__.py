"""What blockc tells people: memory-traffic estimates, the fusion report, numeric A/B checks."""
