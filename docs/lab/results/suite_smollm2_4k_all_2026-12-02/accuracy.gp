set terminal pngcairo size 720,480
set output 'accuracy.png'
set logscale x 2
set xlabel 'budget (tokens)'
set ylabel 'mean task score'
set yrange [0:1.05]
plot 'accuracy.dat' using 1:2 with linespoints title 'locks', 'accuracy.dat' using 1:3 with linespoints title 'locks-tau0.95', 'accuracy.dat' using 1:4 with linespoints title 'oracle', 'accuracy.dat' using 1:5 with linespoints title 'quest', 'accuracy.dat' using 1:6 with linespoints title 'shadowkv', 'accuracy.dat' using 1:7 with linespoints title 'rocketkv', 0.4286 with lines dashtype 2 title 'FullKV'
