from poslens.cli import main

main()
