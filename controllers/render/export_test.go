package render

// Fleet is fleet for the benchmarks of package render_test.
var Fleet = fleet
