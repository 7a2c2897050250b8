"""Network scheduling of the jobs' flows (EchelonFlow): pure cores beside the Rubick policy.

- `topology`: the network (per-node NIC capacity in the hose model, optionally racks behind an
  oversubscribed core) and the links each flow crosses;
- `echelon`: flows, EchelonFlows and their arrangement functions, tardiness;
- `rates`: per-flow rates at one instant under max-min fair sharing, Coflow SEBF+MADD, EchelonFlow
  (tardiness-first + MADD), or strict-priority traffic classes; all work-conserving;
- `pattern`: the flows one training iteration puts between nodes, from a job's plan and placement;
- `fluid`: a flow-level (fluid, event-driven) simulator running jobs' iterations against each other;
- `decide`: per-job traffic classes from the jobs' EchelonFlows (what `network.decided` carries);
- `core`: the bus core publishing `network.decided`.

docs/network.md has the formulas.
"""
