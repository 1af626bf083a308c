// Package scheduling picks, per pool and per request, the endpoint that should
// serve the request and an ordered list of fallbacks: filters narrow the
// candidates, weighted scorers rank them, a picker chooses; plugins are
// grouped into named profiles chosen per pool.
package scheduling
