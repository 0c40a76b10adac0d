"""Where Sudoku models fail and why EB loses accuracy: each puzzle's logic grade (`sudoku_logic`), the first
wrong reveal of a traced sampling run (`reveals`), and the two scripts that make their pages (`eb_mechanism`,
`sudoku_errors`). See README.md."""
