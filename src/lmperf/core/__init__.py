"""The core every question stands on: how a run is named (specs), where it runs (launch), how a
list of runs is swept (sweep), what a result looks like (Report) and the shared vocabulary of
options. Nothing here knows what a question measures."""
