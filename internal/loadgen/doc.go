// Package loadgen is `muster loadgen`: the benchmarks that load a muster
// at a region's scale and print what it costs.
//
//	seed     bulk-creates services, instances, observed windows and
//	         transitions in the database (as a region would have retained)
//	rebuild  times a fresh evaluator rebuilding its state from them
//	         (seeding an empty database first, with ended instances)
//	reports  drives POST /v1/reports as a prober fleet would
//	watch    holds watch subscribers and times how long injected failures
//	         and additions take to reach every one; --restart restarts a
//	         child `muster dev` under them and checks their readmission;
//	         --replicas spreads the subscribers and the hard-failure
//	         reports over a region's replicas and prints the withdrawal
//	         lag by the replica each subscriber was on
//	ui       signs in to the admin UI and times its pages
//	dns      fires DNS queries at muster's zone (a running one, or one
//	         built in process from a synthetic hub) and prints queries/s
//	xds      holds ADS streams on one service's assignment and times how
//	         long a change takes to reach every one
//
// It is a client of muster like any other, through the HTTP API and the
// dev issuer's tokens; seed, rebuild and watch --restart also work on the
// database directly (bulk copies, an in-process evaluator, the stream
// census). The command gives it the one thing it cannot know, how to open
// muster's database (Env.OpenDB), so DATABASE_URL and the dev cluster are
// read in one place, cmd/muster.
package loadgen
