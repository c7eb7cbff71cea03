"""specdeploy's test bed (not shipped): SSH hosts as containers, a simulated SM120 host and its
stand-in apt repository, and the tiny models the test bed serves."""
